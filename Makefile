# The two set-up commands of the README are `./kiln up` and `make test`.
.PHONY: test up lint bench-api bench-scheduler

test:
	scripts/test

up:
	./kiln up

bench-api:
	scripts/bootstrap trainer,dev && .venv/bin/python bench/api_bench.py $(ARGS)

lint:
	scripts/bootstrap trainer,dev && .venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy api core scheduler workers cli trainer rank && .venv/bin/lint-imports --no-cache
