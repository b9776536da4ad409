# The README's commands. `make test` is what CI runs (through .ci/run).
.PHONY: test deps sync lint nbtest pytest export pictures hooks
# pytest-xdist workers for `make pytest` (auto: one per core; `make pytest PYTEST_WORKERS=1` for a serial run)
PYTEST_WORKERS ?= auto

test: sync lint pytest   ## everything CI checks: the notebooks' examples run inside pytest (tests/test_notebooks.py)

deps:     ## the system packages the browser, Slurm, talks and compile tests need (apt; what CI installs first)
	bash .ci/deps

sync:     ## notebooks and library in sync, notebooks clean
	@bash .ci/check_sync

lint:     ## ruff: the notebooks, the generated package, the tests and the tools formatted and checked
	ruff format --check --quiet nbs tests tools
	ruff check qmind_render tests tools nbs

nbtest:   ## every notebook's examples alone (cells flagged `slow` skipped; the talks run in tests/test_talks.py); `make test` runs them in pytest
	nbdev-test --n-workers 2 --skip-folder-re '^(_|\.|talks$$)'

pytest:   ## the notebooks, and what a notebook can't hold: subprocesses, servers, browsers, torchrun (a worker per core; a file, or a notebook, per unit; heaviest first)
	python -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=15

export:   ## after editing a notebook: its cells formatted, exported, cleaned
	ruff format --quiet nbs && nbdev-export && nbdev-clean

pictures: ## run each stage notebook (slow cells too) and store its closing picture, the cells tagged `picture` only
	python tools/pictures.py

hooks:    ## once per clone: notebook-aware git merge/diff drivers, clean-on-save in Jupyter, `jupyter lab` opening on nbs/index.ipynb
	nbdev-install-hooks
	@# an editable install leaves out the data file that enables qmind_render.docs.lab (a wheel has it)
	install -D -m 644 jupyter-config/jupyter_server_config.d/qmind_render.json \
	  "$$(python -c 'import sys; print(sys.prefix)')/etc/jupyter/jupyter_server_config.d/qmind_render.json"
