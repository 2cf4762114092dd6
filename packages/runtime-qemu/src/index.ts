/**
 * @engram/runtime-qemu: engram's QEMU runtime.
 *
 *   QemuRuntime    the `VmRuntimeShape` on QEMU (`make`, `layer`)
 *   Qmp            a small typed QMP client
 *   QemuMigration  QEMU's migration figures as engram's rounds and guard inputs
 *   QemuProcess    one QEMU process per VM: command line, files, /proc
 *   Accel          the KVM probe (TCG when KVM does not really work)
 */
export * as Accel from "./Accel.js"
export * as QemuMigration from "./QemuMigration.js"
export * as QemuProcess from "./QemuProcess.js"
export * as QemuRuntime from "./QemuRuntime.js"
export * as Qmp from "./Qmp.js"
export type { QemuConfig, QemuRuntimeShape } from "./QemuRuntime.js"
