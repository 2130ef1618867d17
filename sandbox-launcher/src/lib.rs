//! sluice-launcher: the `sluice` command. Boots a micro-VM, jails QEMU and the
//! gateway, and manages policies.

pub mod jail;
