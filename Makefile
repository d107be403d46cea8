VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test quick lint bench docs serve-docs clean hlsjs

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned: an unpinned torch (or a dependency's range) pulls a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev,serve,docs]'
	$(MAKE) --no-print-directory hlsjs
	touch $(STAMP)

# hls.js for the browser's HLS tests and the page's GET /hls.js, into the project's own folder (the tests
# never fetch it). Part of the install; on its own for a checkout installed before it. A failed npm stops
# make, and the file must be there.
hlsjs:
	npm install --prefix .hlsjs --no-save --no-audit --no-fund --loglevel=error hls.js@1.7
	test -s .hlsjs/node_modules/hls.js/dist/hls.min.js

demo: $(STAMP)
	$(VENV)/bin/streamvae demo -o demo.mp4

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples docs/*.py
	$(VENV)/bin/ruff format --check src tests bench examples docs/*.py
	$(VENV)/bin/mypy src

# The tests run in 4 worker processes (pytest-xdist), a test file to a worker, so that a file's module-level
# caches (a tiny pipeline's seeded reference call) are built once. 4, not one a CPU: a good part of the suite
# waits (servers, browsers, ranks, paced streams), and on a 2-core machine 4 workers took 209 s where 2 took
# 252 s (one worker: about 440 s).
PYTEST := $(VENV)/bin/python -m pytest -q -n 4 --dist loadfile

test: lint
	$(PYTEST) --durations=20

# The edit loop: every test but the slow ones (real ranks, fresh interpreters) and the browser's.
quick: $(STAMP)
	$(PYTEST) -m "not slow and not browser"

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,serve,bench,provenance]'
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
	$(PY) bench/broadcast.py
	$(PY) bench/provenance.py

# The site: every page and every public name's reference, warnings as errors; -n (nitpicky): a reference
# or a link that does not resolve fails. docs/screenshots.py takes the pictures of it (docs/screenshots/).
docs: $(STAMP)
	rm -rf docs/_build/html
	$(VENV)/bin/sphinx-build -W --keep-going -n -q -b html docs docs/_build/html

serve-docs: docs
	$(PY) -m http.server 8000 --bind 127.0.0.1 --directory docs/_build/html

clean:
	rm -rf $(VENV) .hlsjs build dist src/*.egg-info docs/_build
