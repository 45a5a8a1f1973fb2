# Two images from one file:
#   control - API, scheduler, migrations: no torch (they never import it)
#   worker  - a GPU host: kiln[trainer] with the CUDA build of torch that PyPI ships for Linux
FROM python:3.11-slim AS base
# The source tree is what runs (migrations/versions and frontend/ are read from it, not from site-packages).
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PYTHONPATH=/opt/kiln
WORKDIR /opt/kiln
COPY pyproject.toml README.md ./
COPY api ./api
COPY core ./core
COPY scheduler ./scheduler
COPY workers ./workers
COPY trainer ./trainer
COPY cli ./cli
COPY migrations ./migrations
COPY frontend ./frontend

FROM base AS control
RUN pip install .
RUN useradd --system --uid 10001 kiln
USER kiln
EXPOSE 8421

FROM base AS worker
ARG TORCH_VERSION=2.11.0
RUN pip install "torch==${TORCH_VERSION}" ".[trainer]"
