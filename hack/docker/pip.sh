#!/bin/sh
# pip inside the Docker build: offline from the wheelhouse when it holds wheels (and the build arg
# WHEELHOUSE is not `off`), else online.
#
# Offline (air-gapped, and how hack/docker/build-images.sh builds): /wheelhouse is the build
# context's wheelhouse/ folder, filled by hack/docker/wheelhouse.sh; --no-index makes a missing
# wheel a clear error instead of a silent download. Online: the `pip-cert` build secret, when
# given, is the CA bundle pip trusts (for networks that intercept TLS); PIP_INDEX_URL and
# PIP_EXTRA_INDEX_URL build args pass through the environment (e.g. a CPU-only torch index).
set -eu
if [ "${WHEELHOUSE:-auto}" != off ] && ls /wheelhouse/*.whl >/dev/null 2>&1; then
  exec /opt/tools/bin/pip --disable-pip-version-check "$@" --no-index --find-links /wheelhouse
fi
if [ -s /run/secrets/pip-cert ]; then
  export PIP_CERT=/run/secrets/pip-cert
fi
exec /opt/tools/bin/pip --disable-pip-version-check "$@"
