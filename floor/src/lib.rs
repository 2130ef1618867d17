//! The kernel floor under the gateway: nftables rules (applied through the
//! `nftables` crate, JSON to the `nft` binary) that hold even if the
//! gateway dies or is compromised.
//!
//! - [`ingress::IngressFloor`]: in the VM's network namespace, a netdev
//!   ingress chain on the guest's interface drops every frame before the
//!   kernel's own stack sees it, and a forward chain drops everything. A
//!   packet socket (the gateway's attach) still reads every frame: it sits
//!   before the ingress hook. So the kernel never answers, routes or
//!   forwards guest traffic, and when the gateway is gone the guest has no
//!   network at all.
//! - [`egress::EgressFloor`]: keyed on the gateway's uid, an output chain
//!   that drops the gateway's own packets to loopback, link-local, the
//!   host's addresses and the non-public ranges the policy does not name,
//!   except replies on connections others opened to it (a published port,
//!   a metrics scrape). A compromised gateway still cannot reach the
//!   metadata service or the host's services.
//!
//! Each floor is verified after it is applied (listed back and compared),
//! and ended by [`ingress::IngressFloor::remove`] (fail closed: kept on an
//! interface that still exists) /
//! [`egress::EgressFloor::remove`] (and on drop, best effort).

#![forbid(unsafe_code)]

pub mod egress;
pub mod ingress;
mod link;
pub use link::LinkDown;
mod netns;
mod nft;
mod ruleset;
pub mod run;

pub use nft::FloorError;
