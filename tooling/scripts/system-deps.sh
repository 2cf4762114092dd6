#!/usr/bin/env bash
# The system packages the tests need, installed with apt-get when missing (a no-op once they are
# there): QEMU and a static busybox for the real-guest tests (the guest's kernel comes from
# `apt-get download linux-image-amd64`, so apt's package lists must be present), Chromium for the
# dashboard's browser test (playwright-core never downloads a browser), wrk for `pnpm bench`'s edge. `.ci/run` and the
# README's `pnpm test` both call it. Without root (and without sudo) it says what is missing and
# goes on: the tests that need a missing package then fail with a message naming it.
set -euo pipefail
# embedded-postgres runs the test server as user `postgres` when we are root.
if [ "$(id -u)" -eq 0 ] && ! id postgres >/dev/null 2>&1; then
  echo "system-deps: adding the postgres system user for the embedded test server"
  useradd --system --create-home --shell /usr/sbin/nologin postgres
fi
need=()
command -v qemu-system-x86_64 >/dev/null 2>&1 || need+=(qemu-system-x86)
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
[ -x /usr/bin/chromium ] || need+=(chromium)
# wrk: the fleet bench's HTTP load (Node's fetch cannot drive the edge fast enough to measure it).
command -v wrk >/dev/null 2>&1 || need+=(wrk)
lists=1
command -v apt-cache >/dev/null 2>&1 && { apt-cache show linux-image-amd64 >/dev/null 2>&1 || lists=0; }
[ ${#need[@]} -eq 0 ] && [ "$lists" -eq 1 ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: no apt-get here; install ${need[*]:-nothing} yourself" >&2
  exit 0
fi
as_root=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then as_root=(sudo -n)
  else echo "system-deps: not root; install with apt-get: ${need[*]} (and run apt-get update)" >&2; exit 0; fi
fi
echo "system-deps: apt-get update"
"${as_root[@]}" apt-get update -qq
if [ ${#need[@]} -gt 0 ]; then
  echo "system-deps: installing ${need[*]}"
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
