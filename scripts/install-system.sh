#!/usr/bin/env bash
# Installs the real services the test suite starts (Redis, Memcached, Varnish, nginx, Prometheus, Chromium) when missing,
# and the toolchain that builds llama.cpp's llama-server for the suite and the benchmarks (cmake, g++, patch).
# Debian packages only; nothing is downloaded from anywhere else.
set -euo pipefail
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v memcached >/dev/null || need+=(memcached)
command -v varnishd >/dev/null || need+=(varnish)
[ -e /usr/lib/x86_64-linux-gnu/varnish/vmods/libvmod_xkey.so ] || ls /usr/lib/*/varnish/vmods/libvmod_xkey.so >/dev/null 2>&1 || need+=(varnish-modules)
command -v nginx >/dev/null || need+=(nginx)
ls /usr/lib/nginx/modules/ngx_http_js_module.so >/dev/null 2>&1 || need+=(libnginx-mod-http-js)
ls /usr/lib/nginx/modules/ngx_http_cache_purge_module.so >/dev/null 2>&1 || need+=(libnginx-mod-http-cache-purge)
command -v cc >/dev/null || need+=(gcc)  # varnishd compiles VCL with the system C compiler
command -v cmake >/dev/null || need+=(cmake)  # harness/peers/llamacpp_build.py: llama-server and llama-bench
command -v g++ >/dev/null || need+=(g++)
command -v patch >/dev/null || need+=(patch)  # the GCC 12 AMX tile-config patch (harness/peers/patches/)
command -v wrk >/dev/null || need+=(wrk)
command -v prometheus >/dev/null || need+=(prometheus)
command -v chromium >/dev/null || need+=(chromium)
command -v buildah >/dev/null || need+=(buildah)  # the images (deploy/images/build.py, `make image`)
command -v debootstrap >/dev/null || need+=(debootstrap)  # their Debian base, from Debian's packages
if [ ${#need[@]} -gt 0 ]; then
  echo "installing system packages: ${need[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
