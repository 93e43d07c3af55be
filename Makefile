# Two entry points: `make demo` (the default sweep and its report) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# Older onnxruntime releases whose schemas take the form mtplab builds for onnxruntime-gpu 1.30/1.31:
# `make test` also runs tests/test_forms.py under each, in its own cached environment (made on first
# use, reused after; only what that file imports is installed, mtplab itself comes from this tree).
ORT_OLD ?= 1.30.0 1.31.1
OLD_STAMPS := $(foreach v,$(ORT_OLD),.venv-ort-$(v)/.installed)

.PHONY: demo test test-full train bench lint setup clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[cpu,dev,cluster,peer]"
	$(BIN)/python -m ipykernel install --sys-prefix --name mtplab --display-name "mtplab" >/dev/null
	$(BIN)/python -m compileall -q mtplab  # bytecode once: where PYTHONDONTWRITEBYTECODE is set, each process would compile it
	touch $(STAMP)

.venv-ort-%/.installed: Makefile
	$(PY) -m venv .venv-ort-$*
	.venv-ort-$*/bin/python -m pip install -q onnxruntime==$* numpy onnx tqdm pytest pytest-timeout
	touch $@

setup: $(STAMP)

# the report names the sweep, not its folder: it is found in the results root ($MTPLAB_RESULTS, else results/)
demo: $(STAMP)
	$(BIN)/mtplab sweep --grid default --name demo --resume --workers 1
	$(BIN)/mtplab report demo

# Every check runs even when one before it fails; the last line names the ones that failed. Two workers: one per
# core of the smallest machine it is kept fast on. The slow end-to-end checks (marked `full`) are test-full's.
test: $(STAMP) $(OLD_STAMPS)
	@failed=""; \
	$(BIN)/ruff check mtplab tests benchmarks notebooks || failed="$$failed lint"; \
	$(BIN)/python -m pytest -q -n 2 -m "not full" || failed="$$failed tests"; \
	for v in $(ORT_OLD); do echo "== onnxruntime $$v"; PYTHONPATH=$(CURDIR) .venv-ort-$$v/bin/python -m pytest -q \
		-p no:cacheprovider --noconftest tests/test_forms.py || failed="$$failed forms-on-onnxruntime-$$v"; done; \
	if [ -n "$$failed" ]; then echo "make test: FAILED:$$failed"; exit 1; fi; echo "make test: every check passed"

test-full: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 -m full

# Trains models/pycode again (torch lives only in .venv-train, never in make test or make demo): data, training
# (resumable: a stopped run continues from train/work/ckpt.pt), export with its checks, the model card, the prompt sets.
TRAIN_STEPS ?= 1352
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
.venv-train/.installed: train/requirements.txt
	$(PY) -m venv .venv-train
	.venv-train/bin/python -m pip install -q $(if $(wildcard /opt/wheels),--find-links /opt/wheels,--extra-index-url $(TORCH_INDEX)) \
		-r train/requirements.txt
	touch $@

train: .venv-train/.installed
	.venv-train/bin/python train/data.py
	nice -n 19 .venv-train/bin/python train/train.py --steps $(TRAIN_STEPS) --resume
	.venv-train/bin/python train/export.py
	.venv-train/bin/python train/card.py
	.venv-train/bin/python train/prompts.py

bench: $(STAMP)
	$(BIN)/python benchmarks/bench.py

lint: $(STAMP)
	$(BIN)/ruff check mtplab tests benchmarks notebooks

clean:
	rm -rf $(VENV) .venv-ort-* .pytest_cache
