VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned: an unpinned torch (or a dependency's range) pulls a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev,serve]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/streamvae demo -o demo.mp4

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples
	$(VENV)/bin/ruff format --check src tests bench examples
	$(VENV)/bin/mypy src

test: lint
	$(VENV)/bin/python -m pytest -q --durations=20

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,serve,bench]'
	$(PY) bench/pipeline.py
	$(PY) bench/wan.py
	$(PY) bench/generate.py
	$(PY) bench/families.py
	$(PY) bench/pipelines.py
	$(PY) bench/producers.py
	$(PY) bench/distributed.py
	$(PY) bench/encode_budget.py
	$(PY) bench/interactions.py
	$(PY) bench/soak.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info
