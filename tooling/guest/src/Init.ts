/**
 * The guest's `/init` and what it prints. The init mounts the basics, touches
 * `engram.fill_mib` MiB of its RAM (a tmpfs file of non-zero data, kept: a guest that has used
 * its memory), prints `engram-ready <boot id>` (its readiness signal), then loops forever:
 * rewrite `engram.dirty_kib_s × tick` KiB of a hot `engram.hot_mib` MiB tmpfs file (a ring,
 * random data so no page is a zero page), print `engram-tick <boot id> <n> <uptime s>` on the
 * serial console, sleep `engram.tick_ms`. The boot id is the kernel's, new on every boot, so a
 * guest that continued (same boot id, a higher counter) is told from one that rebooted.
 */

/** The guest's knobs, passed on the kernel command line. */
export interface GuestLoad {
  /** KiB the guest rewrites per second (0 = idle apart from the counter). */
  readonly dirtyKibPerSec?: number
  /** Size of the rewritten ring: the dirty set saturates here. */
  readonly hotMib?: number
  /** One loop turn: dirty, print, sleep. */
  readonly tickMs?: number
  /** MiB of RAM the guest fills with non-zero data at boot and keeps (0 = only what booting touches). */
  readonly fillMib?: number
}

/** The kernel command line for `load` (serial console on ttyS0). */
export const cmdline = (load: GuestLoad = {}): string =>
  [
    "console=ttyS0",
    "quiet",
    "panic=-1",
    `engram.dirty_kib_s=${Math.max(0, Math.round(load.dirtyKibPerSec ?? 0))}`,
    `engram.hot_mib=${Math.max(1, Math.round(load.hotMib ?? 16))}`,
    `engram.tick_ms=${Math.max(10, Math.round(load.tickMs ?? 100))}`,
    ...(load.fillMib === undefined || load.fillMib <= 0 ? [] : [`engram.fill_mib=${Math.round(load.fillMib)}`]),
  ].join(" ")

/** The `/init` script (busybox ash). */
export const initScript = `#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
mount -t tmpfs -o mode=1777,size=95% tmpfs /run
rate=0; hot=16; tick=100; fill=0
for a in $(cat /proc/cmdline); do
  case "$a" in
    engram.dirty_kib_s=*) rate=\${a#*=};;
    engram.hot_mib=*) hot=\${a#*=};;
    engram.tick_ms=*) tick=\${a#*=};;
    engram.fill_mib=*) fill=\${a#*=};;
  esac
done
boot=$(cat /proc/sys/kernel/random/boot_id)
dd if=/dev/urandom of=/run/src bs=64k count=16 2>/dev/null
# 4 KiB blocks per tick, and the ring's size in blocks.
chunk=$((rate * tick / 1000 / 4))
blocks=$((hot * 256))
pause=$(awk "BEGIN{print $tick/1000}")
echo "engram-guest boot=$boot dirty_kib_s=$rate hot_mib=$hot tick_ms=$tick fill_mib=$fill"
# Used memory: non-zero pages (a zero page is free to capture), kept for the guest's life.
# Doubled up from the 1 MiB of random data to a block of at most 64 MiB and an eighth of the
# fill (the doubling and the fill hold at most fill + block), then written in whole blocks:
# few large copies (every syscall is dear under TCG).
if [ $fill -gt 0 ]; then
  cp /run/src /run/block; size=1
  while [ $((size * 2)) -le 64 ] && [ $((size * 8)) -le $fill ]; do
    cat /run/block /run/block > /run/block2; mv /run/block2 /run/block; size=$((size * 2))
  done
  left=$fill
  while [ $left -ge $size ]; do cat /run/block; left=$((left - size)); done > /run/fill
  [ $left -gt 0 ] && dd if=/run/block bs=1M count=$left >> /run/fill 2>/dev/null
  rm /run/block
fi
echo "engram-ready $boot"
n=0; off=0
while true; do
  n=$((n+1))
  left=$chunk
  while [ $left -gt 0 ]; do
    c=$left; [ $c -gt 256 ] && c=256
    [ $((off + c)) -gt $blocks ] && c=$((blocks - off))
    dd if=/run/src of=/run/hot bs=4k count=$c seek=$off conv=notrunc 2>/dev/null
    off=$(( (off + c) % blocks )); left=$((left - c))
  done
  read up idle < /proc/uptime
  echo "engram-tick $boot $n $up"
  sleep $pause
done
`

/** One counter line of the console. */
export interface Tick {
  readonly bootId: string
  readonly n: number
  /** The guest's uptime when it printed the line, in seconds. */
  readonly uptimeS: number
}

const tickLine = /^engram-tick ([0-9a-f-]{36}) (\d+) ([\d.]+)\s*$/

/** Parses a console line; null when it is not a whole counter line. */
export const parseTick = (line: string): Tick | null => {
  const m = tickLine.exec(line)
  return m === null || m[1] === undefined || m[2] === undefined || m[3] === undefined
    ? null
    : { bootId: m[1], n: Number(m[2]), uptimeS: Number(m[3]) }
}

/** The line the guest prints once it is ready (after its fill), before its first counter line. */
export const readyLine = /^engram-(ready|tick) [0-9a-f-]{36}/

/** Every counter line of a console text, in order. */
export const ticks = (consoleText: string): Tick[] =>
  consoleText
    .split(/\r?\n/)
    .map(parseTick)
    .filter((t): t is Tick => t !== null)

/** A calm guest: 256 KiB/s over a 4 MiB ring, a counter every 100 ms (the demo's and the agent tests' default). */
export const calmLoad: GuestLoad = { dirtyKibPerSec: 256, hotMib: 4, tickMs: 100 }
