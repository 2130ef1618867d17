//! DNS for the guest: the gateway answers the guest's queries itself
//! ([`server`]), asking the upstream resolvers ([`upstream`]) with queries of
//! its own making, and records every address it hands the guest in the
//! sandbox's name-to-address [`table`] before the answer leaves, so a
//! connection that follows an answer can never race it.
//!
//! Parsing and sanitising are sluice-inspect's ([`sluice_inspect::dns`]), the
//! one DNS reader of the project: queries that do not parse or whose name does
//! not normalise like the policy's (non-ASCII, over-long labels, compression
//! loops) get FORMERR; only A questions are forwarded
//! ([`server::forwarded_type`]); answers keep only the A records at the end
//! of the question's CNAME chain. IPv6 is off in this gateway: AAAA queries
//! are answered locally with an empty NOERROR answer. A response that does
//! not parse or does not match the query is replaced by SERVFAIL (fail
//! closed).

// `server`, `table` and `upstream` are public for the in-process drivers
// (`test-util`), like the gateway's own driver modules. `approval` holds
// what the server asks the approval backend (`unlisted: ask`,
// docs/approval.md); its reply travels as a session event.
public_for_drivers!(pub(crate) mod approval, server, table, upstream);
pub(crate) mod session;

pub(crate) use server::{Asker, Delivery, DnsServer, Outcome, Served};
#[cfg_attr(not(feature = "test-util"), expect(unreachable_pub))]
pub use table::DnsTable;
pub(crate) use upstream::UpstreamReply;
