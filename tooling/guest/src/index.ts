/**
 * @engram/guest: the test guest of engram's real-VM runtimes.
 *
 *   ensureGuest()   the kernel and initramfs, built once into `.tmp/guest`
 *   cmdline(load)   the kernel command line: serial console, dirty rate, hot set, tick, RAM filled
 *   readyLine       the console line that says the guest is ready (booted and filled, or continuing)
 *   agentEnvironment(load)   the host agent's ENGRAM_QEMU_* settings that boot it (its ready line too)
 *   ticks(text)     the counter lines of a console, to tell "continued" from "rebooted"
 *   consoleTicks, boots, runQemuTests   what the real-QEMU tests share
 */
export * as Cpio from "./Cpio.js"
export { agentEnvironment, defaultCacheDir, ensureGuest, initramfs, isStaticElf, type Guest, type GuestOptions } from "./Guest.js"
export { calmLoad, cmdline, initScript, parseTick, readyLine, ticks, type GuestLoad, type Tick } from "./Init.js"
export { boots, consoleTicks, haveQemu, runQemuTests } from "./Console.js"
