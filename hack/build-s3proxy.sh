#!/usr/bin/env bash
# Fetch s3proxy (Apache-2.0; Java) from Maven Central with Maven: the S3-compatible server the tests
# start (tests/s3_server.py). It checks AWS SigV4 signatures, so the tests exercise the signing client.
# MinIO's server is AGPL and SeaweedFS took >10 min to build cold from the Go module proxy; this jar
# (one artifact with its dependencies, ~30 MB) comes in well under a minute cold (tests/README.md).
#
# The jar goes to ${XDG_CACHE_HOME:-$HOME/.cache}/specdecode/s3proxy/<version>/s3proxy.jar. The last line of
# stdout is the jar's path.
#
# Usage: hack/build-s3proxy.sh              fetch it when missing, print its path
#        hack/build-s3proxy.sh --print-path print its path only (fetches nothing)
set -euo pipefail

S3PROXY_VERSION="${S3PROXY_VERSION:-2.6.0}"
DIR="${XDG_CACHE_HOME:-$HOME/.cache}/specdecode/s3proxy/$S3PROXY_VERSION"
JAR="$DIR/s3proxy.jar"

case "${1:-}" in
  --print-path) echo "$JAR"; exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--print-path]" >&2; exit 2 ;;
esac

if [[ ! -f "$JAR" ]]; then
  command -v java >/dev/null || { echo "java not found: s3proxy needs Java >= 17 (apt-get install openjdk-17-jre-headless)" >&2; exit 1; }
  command -v mvn >/dev/null || { echo "mvn not found: install Maven (apt-get install maven) to fetch s3proxy" >&2; exit 1; }
  mkdir -p "$DIR"
  start=$SECONDS
  # A Maven repository of its own in the cache dir: nothing else's ~/.m2 is read or written.
  mvn -q -B -Dmaven.repo.local="$DIR/m2" dependency:get -Dtransitive=false \
    -Dartifact="org.gaul:s3proxy:$S3PROXY_VERSION:jar:jar-with-dependencies" >&2
  cp "$DIR/m2/org/gaul/s3proxy/$S3PROXY_VERSION/s3proxy-$S3PROXY_VERSION-jar-with-dependencies.jar" "$JAR.tmp"
  mv "$JAR.tmp" "$JAR"
  rm -rf "$DIR/m2"
  echo "[build-s3proxy] fetched s3proxy $S3PROXY_VERSION in $((SECONDS - start)) s" >&2
fi
echo "$JAR"
