# make demo   - the main job end to end on an embedded broker
# make test   - the whole test suite, then the connector's tests on the oldest PySpark
# make crashloop - kill -9 / SIGTERM restarts under load, counting what was lost
# Both create .venv and install what they need on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: demo test test-lowest bench crashloop mutants protos check-python check-java clean

# The demo needs the spark extra only (no test tools), installed quietly: pip's output goes
# to $(VENV)/pip.log and is shown only when the install fails. An environment `make test`
# installed has it already.
DEMO_INSTALLED := $(VENV)/.installed-spark
demo: check-java $(DEMO_INSTALLED)
	@$(BIN)/python examples/demo.py

$(DEMO_INSTALLED): pyproject.toml | check-python
	@if [ -f $(INSTALLED) ] && [ $(INSTALLED) -nt pyproject.toml ]; then touch $@; exit 0; fi; \
	echo "Installing pynsq-broker[spark] into $(VENV)/ (the first time only; pip's log: $(VENV)/pip.log)"; \
	$(PYTHON) -m venv $(VENV) && \
	{ $(BIN)/python -m pip install --disable-pip-version-check --upgrade pip && \
	  $(BIN)/python -m pip install --disable-pip-version-check -e '.[spark]' \
	      --config-settings editable_mode=compat; } > $(VENV)/pip.log 2>&1 || \
	{ tail -n 30 $(VENV)/pip.log; echo "pip failed: the whole log is $(VENV)/pip.log"; exit 1; }; \
	touch $@

# The suite runs in $(TEST_WORKERS) processes (pytest-xdist); the tests on the shared Spark
# session all run in one of them. TEST_WORKERS=0 runs it in this one process.
TEST_WORKERS ?= 2
test: check-java $(INSTALLED)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup
	$(MAKE) --no-print-directory test-lowest

# The connector on the oldest PySpark it supports, every dependency at its lower bound
# (.ci/lowest.txt), in a second environment: the writers, the options, and the stream
# source's refusal naming the PySpark it needs (about 3 minutes on 2 cores).
LOWEST := .venv-lowest
LOWEST_TESTS := tests/test_spark_versions.py tests/test_connector_parsing.py \
	tests/test_writer_requests.py tests/test_spark_writers.py
LOWEST_SELECT := not test_spark_writers or batch_write or body_column or null_body
test-lowest: check-java $(LOWEST)/.installed
	$(LOWEST)/bin/python -m pytest -q -n 0 -p no:cacheprovider $(LOWEST_TESTS) -k '$(LOWEST_SELECT)'

$(LOWEST)/.installed: pyproject.toml .ci/lowest.txt | check-python
	$(PYTHON) -m venv $(LOWEST)
	$(LOWEST)/bin/python -m pip install -q --upgrade pip
	$(LOWEST)/bin/python -m pip install -q -c .ci/lowest.txt -e '.[spark]' \
		--config-settings editable_mode=compat pytest pytest-timeout pytest-xdist hypothesis
	touch $@

# Benchmarks: one table of ratios against same-run baselines (BENCH_ARGS=--quick for a short run).
bench: check-java $(INSTALLED)
	$(BIN)/python -m benchmarks.run $(BENCH_ARGS)

# Mutation testing: plants small bugs one at a time in the modules configured in
# pyproject.toml ([tool.mutmut]) and runs their fast tests against each (MUTANTS="broker.storage.*"
# for one area); `$(BIN)/mutmut results` lists what survived.
mutants: $(VENV)/.installed-dev
	nice -n 10 $(BIN)/mutmut run --max-children 1 $(MUTANTS)

$(VENV)/.installed-dev: $(INSTALLED)
	$(BIN)/python -m pip install -e '.[dev]' --config-settings editable_mode=compat
	touch $@

# The crash loop: pynsqd killed and restarted under load, every acknowledged message
# accounted for (CRASHLOOP_ARGS="--duration 600" for longer); exits 1 on any loss.
crashloop: $(INSTALLED)
	$(BIN)/python -m benchmarks.crashloop $(CRASHLOOP_ARGS)

# Regenerate the gRPC stubs in broker/api/ from protos/ (commit the result).
protos: $(INSTALLED)
	$(BIN)/python -m grpc_tools.protoc -Ibroker/api=protos/pynsq/v1 \
		--python_out=. --grpc_python_out=. --pyi_out=. broker/api/broker.proto

$(INSTALLED): pyproject.toml | check-python
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[test]' --config-settings editable_mode=compat
	touch $@

check-python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || \
		{ echo "Python 3.11 or newer is required ($(PYTHON) is older); set PYTHON=python3.11"; exit 1; }

check-java:
	@command -v java >/dev/null 2>&1 || \
		{ echo "Java 17 or newer is required by Spark 4 and was not found on PATH: install a JDK 17+ (e.g. apt-get install openjdk-17-jre-headless)"; exit 1; }

clean:
	rm -rf $(VENV) $(LOWEST) build *.egg-info .pytest_cache spark-warehouse
