//! The end-to-end harness: network namespaces that act as the guest and as a
//! fake internet, driven by real clients.
