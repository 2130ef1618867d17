//! Fuzz guest query parsing and the error answers built from it.

use sluice_inspect::dns;

/// One fuzz input (the libFuzzer target and the corpus replay call this).
pub fn run(data: &[u8]) {
    match dns::parse_query(data) {
        Ok(query) => {
            let refused = dns::refused_response(&query);
            let nx = dns::nxdomain_response(&query);
            // Answers we build must parse back to the same id.
            for bytes in [refused, nx].into_iter().flatten() {
                if let Ok(msg) = hickory_proto::op::Message::from_vec(&bytes) {
                    assert_eq!(msg.metadata.id, query.id);
                }
            }
        }
        Err(reject) => {
            let _ = dns::reject_response(data, &reject);
            let _ = dns::formerr_response(data);
        }
    }
}
