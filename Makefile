# pidfence: two commands do everything on a fresh machine.
#   make demo   set up, start the embedded services, run the main job with faults, print the verdict
#   make test   set up, run the whole test suite (what CI runs)

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.pidfence-installed
# The JVM jars (ZooKeeper, Kafka, Spark's Kafka connector, delta-spark) come from Maven Central by
# coordinates into the user's cache (`pidfence jars`, as for any user), shared by every clone.
export PIDFENCE_JAR_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/pidfence/jars
JARS   := $(PIDFENCE_JAR_CACHE)/.pidfence-jars
# Class-data-sharing archives of the JVMs pidfence starts (ZooKeeper, Kafka, the Spark driver),
# recorded once by a small pipeline: a Spark driver then starts on ~5 CPU seconds instead of ~10.
ARCHIVES := $(PIDFENCE_JAR_CACHE)/cds/.complete
# The TCP fault proxy of the network fault tests (issue 24), built from source when go is present.
TOXIPROXY := .cache/bin/toxiproxy-server
TOXIPROXY_MODULE := github.com/Shopify/toxiproxy/v2/cmd/server@v2.12.0
# Prometheus' rule checker, for the alert rules' own tests (docs/alerts/pidfence.test.yml), built
# from source when go is present: about 4 minutes on 2 cores the first time.
PROMTOOL := .cache/bin/promtool
PROMTOOL_MODULE := github.com/prometheus/prometheus/cmd/promtool@v0.316.0
PYTEST_ARGS ?=
# pytest-xdist workers of `make test`, each with its own ZooKeeper, Kafka and Spark (tests/README.md);
# three on the 2-core machine: 18 min 57 s against 20 min 23 s with two (before the class archives),
# and 16 min 58 s against 19 min 55 s with four. TEST_WORKERS=0 runs the suite serially in one process.
TEST_WORKERS ?= 3

.PHONY: setup test unit lint demo bench under-load clean distclean

setup: $(STAMP) $(JARS) $(ARCHIVES) $(TOXIPROXY) $(PROMTOOL)

$(STAMP): pyproject.toml constraints.txt
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found: install Python 3.11+"; exit 2; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --no-compile -c constraints.txt -e '.[dev]'
	@# Compile on both cores what pip would compile on one (58 s -> 51 s with the compile), and
	@# pidfence's own sources too: this machine sets PYTHONDONTWRITEBYTECODE=1, so what is not
	@# compiled here is compiled again by every process (tests/README.md). A module that does not
	@# compile (a template in some package) is only imported slower, never refused.
	@$(BIN)/python -m compileall -q -j 0 $(VENV)/lib src >/dev/null || echo "note: some modules were not compiled ahead; they compile on import"
	@touch $@

$(JARS): $(STAMP) src/pidfence/jars/components.py
	@command -v java >/dev/null || { echo "error: java not found: install a Java 17+ runtime (apt-get install openjdk-17-jre-headless)"; exit 2; }
	$(BIN)/pidfence jars
	@# The object-store tests' s3a:// file system (686 MB of AWS SDK): fetched here, not mid-suite.
	$(BIN)/pidfence jars hadoop-aws
	@touch $@

$(ARCHIVES): $(JARS)
	$(BIN)/python -m pidfence.services.class_archive_record
	@mkdir -p $(@D) && touch $@

# $(call go_tool,MODULE@VERSION,COMMAND,WHAT SKIPS WITHOUT IT): go install MODULE, its COMMAND
# moved to the target; without go, one line naming what will skip.
define go_tool
	@if command -v go >/dev/null; then \
		GOBIN=$(CURDIR)/.cache/$(2)-build go install $(1) \
		&& mkdir -p $(@D) && mv .cache/$(2)-build/$(2) $@ && rm -rf .cache/$(2)-build; \
	else \
		echo "note: go not found: $(notdir $@) not built, $(3) will skip (install go, then make setup)"; \
	fi
endef

$(TOXIPROXY):
	$(call go_tool,$(TOXIPROXY_MODULE),server,the network fault tests)

$(PROMTOOL):
	$(call go_tool,$(PROMTOOL_MODULE),promtool,the alert rules' promtool checks)

test: setup
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

unit: $(STAMP)
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m mypy
	$(BIN)/lint-imports

demo: setup
	$(BIN)/pidfence demo

# The demo smoke test and the chaos tier 5 times in a row with one core kept busy (issue 10).
under-load: setup
	$(BIN)/python -m tests.under_load --times 5 -- tests/chaos tests/integration/test_demo_smoke.py

bench: setup
	$(BIN)/pidfence bench engine --quick

clean:
	rm -rf out build src/*.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis

distclean: clean
	rm -rf $(VENV) .cache
