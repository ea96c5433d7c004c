# dltrace: the README's commands. `make help` lists the targets.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
RUN ?= traces/demo-ddp-np2

.PHONY: help setup main demo sweep-demo test test-fast bench lint docs clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' Makefile | sed 's/:.*## /\t/' | column -t -s $$'\t'

setup:  ## install everything on a fresh machine (Debian packages, .venv, Horovod build cache)
	@bash tools/setup.sh

main: setup demo  ## set up, then trace a 2-rank DDP run and write its PDF report

demo:  ## trace a 2-rank DDP run, print its phases, write reports/demo.pdf
	rm -rf $(RUN)
	$(BIN)/instrument run -np 2 --name $(notdir $(RUN)) runs/ddp_resnet.py --batch-size 32 --steps 20
	$(BIN)/analyze phases $(RUN)
	$(BIN)/analyze report $(RUN) -o reports/demo.pdf

sweep-demo:  ## a designed experiment: 1 and 2 ranks x 2 replications, compared, reports/sweep-tiny.pdf
	$(BIN)/instrument sweep runs/designs/tiny.toml
	$(BIN)/analyze compare traces/sweeps/tiny
	$(BIN)/analyze report traces/sweeps/tiny -o reports/sweep-tiny.pdf

test: setup  ## set up, lint, then run all tests, slow multi-rank runs included (what CI runs)
	$(MAKE) --no-print-directory lint
	DLTRACE_REQUIRE_ALL=1 $(PY) -m pytest -q

test-fast:  ## the quick tests only (no multi-rank runs)
	$(PY) -m pytest -q -m "not slow"

bench:  ## the benchmarks of bench/README.md (about 25 minutes; up to 7 GB of disk in ~/.cache)
	$(PY) -m bench.ingest --events 1M --repeat 3
	$(PY) -m bench.ingest --events 10M,100M --readers native --repeat 2
	$(PY) -m bench.merge --events 200k --repeat 3
	$(PY) -m bench.merge --events 10M --paths native --repeat 3
	$(PY) -m bench.overhead --repeat 8 --steps 40

lint:  ## ruff and mypy
	$(BIN)/ruff check traceio instrument analyze reports runs tests bench
	$(BIN)/mypy

docs:  ## regenerate docs/schema.md and docs/patterns.md from analyze/schema.py and the pattern table
	$(PY) -c "import analyze.schema as s; open('docs/schema.md', 'w').write(s.markdown())"
	$(PY) -c "from analyze.tables import pattern_set as p; open('docs/patterns.md', 'w').write(p.markdown())"

clean:  ## remove traces and reports written by runs (keeps .venv and the build cache)
	find traces -mindepth 1 -maxdepth 1 ! -name README.md -exec rm -rf {} +
	rm -f reports/*.pdf reports/*.png
