//! sluice-gateway: the per-VM network sidecar.
//!
//! One process serves one guest: it speaks Ethernet with the guest over
//! QEMU's stream socket and re-originates allowed flows from host sockets.
