//! Runtime approval of destinations the policy does not list.
//!
//! When a policy says `unlisted: ask`, the gateway holds the guest's DNS
//! query for a name no rule lists and asks a [`Backend`] whether to open it.
//! This crate owns everything about that question that does not depend on
//! the datapath:
//!
//! - [`wire`]: the question and the answer, as JSON, with their bounds;
//! - [`backend`]: the webhook, unix-socket and terminal backends;
//! - [`broker`]: one sandbox's questions: asked once per name, bounded in
//!   number and rate, and the standing decisions with their lifetimes;
//! - [`handoff`]: an `always` entry handed to the launcher, which writes
//!   the overlay beside the policy for a gateway that may not.
//!
//! What may be asked at all (a plain allowlist miss, never a platform,
//! deny-list or private destination) is the policy's decision, not this
//! crate's: the broker is only consulted for names the policy would ask
//! about. A backend that fails, times out or answers something unreadable
//! yields a deny, never an allow.

#![forbid(unsafe_code)]

pub mod backend;
pub mod broker;
pub mod handoff;
pub mod wire;

pub use backend::{Backend, BackendError};
pub use broker::{Asked, Broker, BrokerConfig, Grant, Refusal, Until};
pub use wire::{Answer, Choice, Question};
