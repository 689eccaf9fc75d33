# ScanWeaver: `make test` and `make demo` do all set-up on a fresh machine (Python 3.11 + pip).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo install lit pytest bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

test: install pytest lit

pytest: install
	$(PY) -m pytest -q

lit: install
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/lit -v filecheck

demo: install
	$(VENV)/bin/scanweaver demo

bench: install
	$(PY) -m pip install --quiet -e '.[bench]'
	$(VENV)/bin/scanweaver bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
