# The README's commands. `make test` is what CI runs (through .ci/run).
.PHONY: test sync lint nbtest pytest export pictures hooks
# pytest-xdist workers for `make pytest` (auto: one per core; `make pytest PYTEST_WORKERS=1` for a serial run)
PYTEST_WORKERS ?= auto

test: sync lint nbtest pytest   ## everything CI checks, in order of cost

sync:     ## notebooks and library in sync, notebooks clean
	@bash .ci/check_sync

lint:     ## ruff on the generated package, the tests and the tools
	ruff check qmind_render tests tools

nbtest:   ## run every notebook's examples (cells flagged `slow` are skipped); the talks run once, in tests/test_talks.py
	nbdev-test --n-workers 2 --skip-folder-re '^(_|\.|talks$$)'

pytest:   ## what a notebook can't hold: subprocesses, servers, browsers, torchrun (a worker per core, a file per worker)
	python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --durations=15

export:   ## after editing a notebook
	nbdev-export && nbdev-clean

pictures: ## run each stage notebook (slow cells too) and store its closing picture, the cells tagged `picture` only
	python tools/pictures.py

hooks:    ## once per clone: notebook-aware git merge/diff drivers, clean-on-save in Jupyter
	nbdev-install-hooks
