//! Fuzz the policy parser and compiler: any text must yield a policy or a
//! list of positioned errors, never a panic; a compiled policy must answer
//! checks on names and addresses derived from the input without panicking.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use sluice_policy::{CompileOptions, from_yaml_str, normalize_name, platform};

/// One fuzz input (the libFuzzer target and the corpus replay call this).
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut opts = CompileOptions::default();
    opts.host_addresses = vec![IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))];
    match from_yaml_str(text, "fuzz.yaml", &opts) {
        Ok(policy) => {
            let _ = policy.version_hash();
            // Probe with every whitespace-separated word of the input.
            for word in text.split_whitespace().take(64) {
                let word = word.trim_matches(|c: char| "\"'[],:-{}".contains(c));
                let _ = normalize_name(word);
                let v = policy.check_name(word);
                assert_eq!(v.decision, v.reason.decision());
                for ip in [
                    IpAddr::V4(Ipv4Addr::new(93, 184, 215, 14)),
                    IpAddr::V4(Ipv4Addr::LOCALHOST),
                    IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
                ] {
                    let v = policy.check_destination(ip, 443, &[word]);
                    assert_eq!(v.decision, v.reason.decision());
                    if platform::classify(ip).is_always_denied() {
                        assert!(!v.is_allowed(), "platform deny set opened: {ip}");
                    }
                    let _ = policy.check_udp(ip, 443, &[word]);
                    let _ = policy.check_dns_answer(ip);
                }
                let _ = policy.secrets_for_host(word).count();
                let _ = policy.inspect_host(word);
                if let Ok(ip) = word.parse::<IpAddr>() {
                    let _ = platform::classify(ip);
                    let v = policy.check_destination(ip, 22, &[]);
                    assert_eq!(v.decision, v.reason.decision());
                }
            }
        }
        Err(errors) => {
            assert!(!errors.is_empty());
            // YAML also breaks lines on a bare CR: count both (an upper bound).
            let lines = text.bytes().filter(|&b| b == b'\n' || b == b'\r').count() + 1;
            for e in errors.errors() {
                assert!(
                    e.line as usize <= lines,
                    "error line {} beyond the input",
                    e.line
                );
                let shown = e.to_string();
                assert!(shown.starts_with("fuzz.yaml"), "{shown}");
            }
        }
    }
}
