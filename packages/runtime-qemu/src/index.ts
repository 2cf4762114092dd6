/**
 * @engram/runtime-qemu: engram's QEMU runtime.
 *
 *   QemuRuntime    the `VmRuntimeShape` on QEMU (`make`, `layer`)
 *   Snapshots      descents, restores and templates: mapped (RAM files) or stream
 *   Templates      the templates a runtime holds, on disk
 *   RamFile        guest RAM as a file: moving it between a VM, an image and a template
 *   Readiness      the guest's readiness line on its console
 *   VmHost         a runtime's VMs and the primitives every operation uses
 *   Qmp            a small typed QMP client
 *   Monitor        a held VM's QMP monitor across reconnects
 *   QemuMigration  QEMU's migration figures as engram's rounds and guard inputs
 *   QemuProcess    one QEMU process per VM: command line, files, /proc
 *   Accel          the KVM probe (TCG when KVM does not really work)
 */
export * as Accel from "./Accel.js"
export * as QemuMigration from "./QemuMigration.js"
export * as QemuProcess from "./QemuProcess.js"
export * as QemuRuntime from "./QemuRuntime.js"
export * as Monitor from "./Monitor.js"
export * as Qmp from "./Qmp.js"
export * as RamFile from "./RamFile.js"
export * as Readiness from "./Readiness.js"
export * as Snapshots from "./Snapshots.js"
export * as Templates from "./Templates.js"
export * as VmHost from "./VmHost.js"
export type { QemuConfig, QemuRuntimeShape } from "./QemuRuntime.js"
