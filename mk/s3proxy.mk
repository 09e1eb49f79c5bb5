# s3proxy, the S3-compatible server the tests start (tests/s3_server.py), fetched from Maven Central
# by hack/build-s3proxy.sh and cached per machine under ~/.cache/specdecode/s3proxy/<version>/.
# Included by the Makefile; `make test` depends on `s3proxy`.

export SPECDECODE_S3PROXY_JAR := $(shell bash hack/build-s3proxy.sh --print-path)

.PHONY: s3proxy

# ~45 s on a fresh 2-core machine with empty caches, nothing when cached.
s3proxy:
	bash hack/build-s3proxy.sh
