//! The platform address classes: which addresses are never reachable from a
//! sandbox, and which are non-public (reachable only when the policy names
//! them).
//!
//! [`classify`] is pure and allocation-free. The gateway's DNS filter uses it
//! on every answer record and the compiled policy uses it on every
//! destination. IPv6 forms that embed an IPv4 address (IPv4-mapped
//! `::ffff:a.b.c.d`, IPv4-compatible `::a.b.c.d`, NAT64 `64:ff9b::/96` and
//! `64:ff9b:1::/48`, 6to4 `2002::/16`) are classified by the embedded IPv4
//! address, so `::ffff:127.0.0.1` is loopback. Teredo (`2001::/32`) obfuscates
//! its embedded address and is classified [`AddressClass::Reserved`].
//!
//! Cloud providers serve instance metadata, DNS, time and host agents on
//! fixed addresses. Those inside `169.254.0.0/16` or `fe80::/10` are already
//! link-local; the others ([`CLOUD_HOST_SERVICES_V4`],
//! [`CLOUD_HOST_SERVICES_V6`]: public addresses such as Azure's WireServer
//! `168.63.129.16`, CGNAT, reserved and unique-local ones) are classified
//! [`AddressClass::CloudHostService`] before any other class, and are as
//! unreachable as link-local. docs/threat-model.md lists each with its source.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

/// The class of an address, as far as egress policy is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AddressClass {
    /// A globally routable address.
    Public,
    /// `127.0.0.0/8`, `::1`. Always denied.
    Loopback,
    /// `0.0.0.0/8` ("this network"), `::`. Always denied.
    Unspecified,
    /// `169.254.0.0/16`, `fe80::/10`. Always denied (covers the metadata
    /// address `169.254.169.254` of most clouds).
    LinkLocal,
    /// A cloud provider's host service outside link-local space (metadata,
    /// DNS, time, host agent: [`CLOUD_HOST_SERVICES_V4`],
    /// [`CLOUD_HOST_SERVICES_V6`]). Always denied, even where the address is
    /// public.
    CloudHostService,
    /// `224.0.0.0/4`, `ff00::/8`. Always denied.
    Multicast,
    /// `255.255.255.255`. Always denied.
    Broadcast,
    /// RFC 1918 (`10/8`, `172.16/12`, `192.168/16`) and the deprecated IPv6
    /// site-local `fec0::/10`. Denied unless named by the policy.
    Private,
    /// Carrier-grade NAT `100.64.0.0/10`. Denied unless named by the policy.
    SharedCgnat,
    /// IPv6 unique local `fc00::/7`. Denied unless named by the policy.
    UniqueLocal,
    /// `198.18.0.0/15`, `2001:2::/48`. Denied unless named by the policy.
    Benchmarking,
    /// `192.0.2/24`, `198.51.100/24`, `203.0.113/24`, `2001:db8::/32`,
    /// `3fff::/20`. Denied unless named by the policy.
    Documentation,
    /// Other special-purpose space: `240.0.0.0/4`, `192.0.0.0/24`,
    /// `192.88.99.0/24`, `100::/64`, Teredo `2001::/32`, and the remaining
    /// IETF-reserved IPv6 blocks outside `2000::/3`. Denied unless named by
    /// the policy.
    Reserved,
}

impl AddressClass {
    /// Whether the class is in the non-overridable platform deny set
    /// (loopback, unspecified, link-local, cloud host services, multicast,
    /// broadcast): no policy rule can make it reachable.
    #[must_use]
    pub const fn is_always_denied(self) -> bool {
        matches!(
            self,
            Self::Loopback
                | Self::Unspecified
                | Self::LinkLocal
                | Self::CloudHostService
                | Self::Multicast
                | Self::Broadcast
        )
    }

    /// Whether the address is outside public space (anything but
    /// [`AddressClass::Public`]).
    #[must_use]
    pub const fn is_non_public(self) -> bool {
        !matches!(self, Self::Public)
    }

    /// The snake_case name of the class (as serialised).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Public => "public",
            Self::Loopback => "loopback",
            Self::Unspecified => "unspecified",
            Self::LinkLocal => "link_local",
            Self::CloudHostService => "cloud_host_service",
            Self::Multicast => "multicast",
            Self::Broadcast => "broadcast",
            Self::Private => "private",
            Self::SharedCgnat => "shared_cgnat",
            Self::UniqueLocal => "unique_local",
            Self::Benchmarking => "benchmarking",
            Self::Documentation => "documentation",
            Self::Reserved => "reserved",
        }
    }
}

impl std::fmt::Display for AddressClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Classify an address. Pure, allocation-free, total (never panics).
#[must_use]
pub fn classify(ip: IpAddr) -> AddressClass {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

/// Cloud host services on IPv4 addresses outside `169.254.0.0/16`, as
/// (network, prefix length). The sources are in docs/threat-model.md.
pub const CLOUD_HOST_SERVICES_V4: &[(Ipv4Addr, u8)] = &[
    // Azure WireServer: DNS, DHCP, health probes, the VM agent's channel.
    (Ipv4Addr::new(168, 63, 129, 16), 32),
    // Alibaba Cloud instance metadata.
    (Ipv4Addr::new(100, 100, 100, 200), 32),
    // Alibaba Cloud DNS (PrivateZone resolvers).
    (Ipv4Addr::new(100, 100, 2, 136), 32),
    (Ipv4Addr::new(100, 100, 2, 138), 32),
    // Tailscale's host-local resolver and service address ("quad100").
    (Ipv4Addr::new(100, 100, 100, 100), 32),
    // Tencent Cloud private-network DNS.
    (Ipv4Addr::new(183, 60, 83, 19), 32),
    (Ipv4Addr::new(183, 60, 82, 98), 32),
    // Oracle Compute Cloud@Customer (and OCI Classic) instance metadata.
    (Ipv4Addr::new(192, 0, 0, 192), 32),
    // IBM Cloud service network: DNS, NTP, package mirrors, metadata
    // helpers for classic infrastructure.
    (Ipv4Addr::new(161, 26, 0, 0), 16),
    // IBM Cloud private service endpoints (cloud service APIs reachable
    // only from inside IBM Cloud).
    (Ipv4Addr::new(166, 8, 0, 0), 14),
];

/// Cloud host services on IPv6 addresses outside `fe80::/10`, as (network,
/// prefix length). The sources are in docs/threat-model.md.
pub const CLOUD_HOST_SERVICES_V6: &[(Ipv6Addr, u8)] = &[
    // AWS: instance metadata, Route 53 Resolver (DNS), Time Sync (NTP),
    // EKS Pod Identity agent.
    (Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254), 128),
    (Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0253), 128),
    (Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0123), 128),
    (Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0023), 128),
    // Google Cloud metadata server (IPv6).
    (Ipv6Addr::new(0xfd20, 0x00ce, 0, 0, 0, 0, 0, 0x0254), 128),
    // Akamai (Linode) metadata service (IPv6).
    (Ipv6Addr::new(0xfd00, 0xa9fe, 0xa9fe, 0, 0, 0, 0, 1), 128),
    // Scaleway instance metadata (IPv6).
    (Ipv6Addr::new(0xfd00, 0x0042, 0, 0, 0, 0, 0, 0x0042), 128),
];

/// Whether `ip` lies in one of [`CLOUD_HOST_SERVICES_V4`].
fn is_cloud_host_service_v4(ip: Ipv4Addr) -> bool {
    let ip = u32::from(ip);
    CLOUD_HOST_SERVICES_V4.iter().any(|&(net, len)| {
        let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
        ip & mask == u32::from(net) & mask
    })
}

/// Whether `ip` lies in one of [`CLOUD_HOST_SERVICES_V6`].
fn is_cloud_host_service_v6(ip: Ipv6Addr) -> bool {
    let ip = u128::from(ip);
    CLOUD_HOST_SERVICES_V6.iter().any(|&(net, len)| {
        let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
        ip & mask == u128::from(net) & mask
    })
}

/// Classify an IPv4 address.
#[must_use]
pub fn classify_v4(ip: Ipv4Addr) -> AddressClass {
    if is_cloud_host_service_v4(ip) {
        return AddressClass::CloudHostService;
    }
    let o = ip.octets();
    match o {
        [255, 255, 255, 255] => AddressClass::Broadcast,
        [0, ..] => AddressClass::Unspecified,
        [127, ..] => AddressClass::Loopback,
        [169, 254, ..] => AddressClass::LinkLocal,
        [224..=239, ..] => AddressClass::Multicast,
        [240..=255, ..] => AddressClass::Reserved,
        [10, ..] | [192, 168, ..] => AddressClass::Private,
        [172, b, ..] if (16..=31).contains(&b) => AddressClass::Private,
        [100, b, ..] if (64..=127).contains(&b) => AddressClass::SharedCgnat,
        [198, 18 | 19, ..] => AddressClass::Benchmarking,
        [192, 0, 2, _] | [198, 51, 100, _] | [203, 0, 113, _] => AddressClass::Documentation,
        [192, 0, 0, _] | [192, 88, 99, _] => AddressClass::Reserved,
        _ => AddressClass::Public,
    }
}

/// Classify an IPv6 address, looking through IPv4 embeddings.
#[must_use]
pub fn classify_v6(ip: Ipv6Addr) -> AddressClass {
    if let Some(v4) = embedded_v4(ip) {
        return classify_v4(v4);
    }
    let s = ip.segments();
    if ip == Ipv6Addr::UNSPECIFIED {
        return AddressClass::Unspecified;
    }
    if ip == Ipv6Addr::LOCALHOST {
        return AddressClass::Loopback;
    }
    if is_cloud_host_service_v6(ip) {
        return AddressClass::CloudHostService;
    }
    match s[0] {
        0xff00..=0xffff => AddressClass::Multicast,
        0xfe80..=0xfebf => AddressClass::LinkLocal,
        0xfec0..=0xfeff => AddressClass::Private,
        0xfc00..=0xfdff => AddressClass::UniqueLocal,
        0x2001 if s[1] == 0 => AddressClass::Reserved, // Teredo
        0x2001 if s[1] == 0x0db8 => AddressClass::Documentation,
        0x2001 if s[1] == 2 && s[2] == 0 => AddressClass::Benchmarking,
        0x3fff if s[1] <= 0x0fff => AddressClass::Documentation,
        0x0100 if s[1] == 0 && s[2] == 0 && s[3] == 0 => AddressClass::Reserved, // discard
        0x2000..=0x3fff => AddressClass::Public,
        _ => AddressClass::Reserved,
    }
}

/// The IPv4 address embedded in an IPv6 address, for the forms that carry
/// one verbatim: IPv4-mapped, IPv4-compatible (excluding `::` and `::1`),
/// NAT64 well-known and local-use prefixes, and 6to4.
#[must_use]
pub fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let o = ip.octets();
    let low = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    match s {
        // ::ffff:a.b.c.d
        [0, 0, 0, 0, 0, 0xffff, _, _] => Some(low),
        // ::a.b.c.d (deprecated IPv4-compatible), but not :: or ::1
        [0, 0, 0, 0, 0, 0, hi, lo] if hi != 0 || lo > 1 => Some(low),
        // 64:ff9b::/96 NAT64 well-known prefix
        [0x0064, 0xff9b, 0, 0, 0, 0, _, _] => Some(low),
        // 64:ff9b:1::/48 local-use NAT64 (RFC 8215); assume a /96 layout
        [0x0064, 0xff9b, 0x0001, ..] => Some(low),
        // 2002:AABB:CCDD::/48 6to4
        [0x2002, ..] => Some(Ipv4Addr::new(o[2], o[3], o[4], o[5])),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use AddressClass as C;

    #[test]
    fn classification_table() {
        let table: &[(&str, AddressClass)] = &[
            ("8.8.8.8", C::Public),
            ("1.1.1.1", C::Public),
            ("0.0.0.0", C::Unspecified),
            ("0.1.2.3", C::Unspecified),
            ("127.0.0.1", C::Loopback),
            ("127.255.255.254", C::Loopback),
            ("169.254.169.254", C::LinkLocal),
            ("169.254.0.1", C::LinkLocal),
            ("224.0.0.1", C::Multicast),
            ("239.255.255.250", C::Multicast),
            ("255.255.255.255", C::Broadcast),
            ("240.0.0.1", C::Reserved),
            ("10.0.0.1", C::Private),
            ("172.16.0.1", C::Private),
            ("172.31.255.255", C::Private),
            ("172.32.0.1", C::Public),
            ("172.15.255.255", C::Public),
            ("192.168.1.1", C::Private),
            ("100.64.0.1", C::SharedCgnat),
            ("100.127.255.255", C::SharedCgnat),
            ("100.128.0.0", C::Public),
            ("198.18.0.1", C::Benchmarking),
            ("198.19.255.255", C::Benchmarking),
            ("192.0.2.1", C::Documentation),
            ("198.51.100.7", C::Documentation),
            ("203.0.113.9", C::Documentation),
            ("192.0.0.8", C::Reserved),
            ("::", C::Unspecified),
            ("::1", C::Loopback),
            ("fe80::1", C::LinkLocal),
            ("fd00:ec2::254", C::CloudHostService),
            ("fd00:ec2::253", C::CloudHostService),
            ("fd00:ec2::252", C::UniqueLocal),
            ("168.63.129.16", C::CloudHostService),
            ("168.63.129.17", C::Public),
            ("100.100.100.200", C::CloudHostService),
            ("100.100.100.201", C::SharedCgnat),
            ("192.0.0.192", C::CloudHostService),
            ("192.0.0.191", C::Reserved),
            ("161.26.0.10", C::CloudHostService),
            ("161.27.0.0", C::Public),
            ("166.11.255.255", C::CloudHostService),
            ("166.12.0.0", C::Public),
            ("::ffff:168.63.129.16", C::CloudHostService),
            ("64:ff9b::a83f:8110", C::CloudHostService),
            ("2002:a83f:8110::1", C::CloudHostService),
            ("fc00::1", C::UniqueLocal),
            ("ff02::1", C::Multicast),
            ("fec0::1", C::Private),
            ("2001:db8::1", C::Documentation),
            ("3fff::1", C::Documentation),
            ("2001:2::1", C::Benchmarking),
            ("2001::1", C::Reserved),
            ("100::1", C::Reserved),
            ("2606:4700::1111", C::Public),
            ("::ffff:127.0.0.1", C::Loopback),
            ("::ffff:169.254.169.254", C::LinkLocal),
            ("::ffff:10.1.2.3", C::Private),
            ("::ffff:8.8.8.8", C::Public),
            ("::127.0.0.1", C::Loopback),
            ("::10.0.0.1", C::Private),
            ("64:ff9b::7f00:1", C::Loopback),
            ("64:ff9b::a9fe:a9fe", C::LinkLocal),
            ("64:ff9b::808:808", C::Public),
            ("64:ff9b:1::a00:1", C::Private),
            ("2002:7f00:1::", C::Loopback),
            ("2002:c0a8:101::1", C::Private),
            ("2002:808:808::1", C::Public),
        ];
        for (addr, want) in table {
            let ip: IpAddr = addr.parse().unwrap();
            assert_eq!(classify(ip), *want, "{addr}");
        }
    }

    #[test]
    fn always_denied_set() {
        for c in [
            C::Loopback,
            C::Unspecified,
            C::LinkLocal,
            C::CloudHostService,
            C::Multicast,
            C::Broadcast,
        ] {
            assert!(c.is_always_denied(), "{c}");
            assert!(c.is_non_public());
        }
        for c in [
            C::Private,
            C::SharedCgnat,
            C::UniqueLocal,
            C::Benchmarking,
            C::Documentation,
            C::Reserved,
        ] {
            assert!(!c.is_always_denied(), "{c}");
            assert!(c.is_non_public());
        }
        assert!(!C::Public.is_always_denied());
        assert!(!C::Public.is_non_public());
    }

    /// The first and last address of a network given as (address, prefix).
    fn ends(net: u128, len: u8, bits: u32) -> (u128, u128) {
        let host = bits - u32::from(len);
        let size = 1u128.checked_shl(host).map_or(u128::MAX, |s| s - 1);
        (net, net | size)
    }

    #[test]
    fn every_cloud_host_service_is_always_denied_and_its_neighbours_are_not() {
        for &(net, len) in CLOUD_HOST_SERVICES_V4 {
            let (first, last) = ends(u128::from(u32::from(net)), len, 32);
            for inside in [first, last, first + (last - first) / 2] {
                let ip = Ipv4Addr::from(u32::try_from(inside).unwrap());
                assert_eq!(classify_v4(ip), C::CloudHostService, "{ip}");
                assert!(classify(IpAddr::V4(ip)).is_always_denied(), "{ip}");
                // The embedded forms too.
                assert!(classify_v6(ip.to_ipv6_mapped()).is_always_denied());
            }
            for outside in [first - 1, last + 1] {
                let ip = Ipv4Addr::from(u32::try_from(outside).unwrap());
                if is_cloud_host_service_v4(ip) {
                    continue; // the next entry of the table
                }
                let class = classify_v4(ip);
                assert_ne!(class, C::CloudHostService, "{ip}");
                assert!(!class.is_always_denied(), "{ip} is {class}");
            }
        }
        for &(net, len) in CLOUD_HOST_SERVICES_V6 {
            let (first, last) = ends(u128::from(net), len, 128);
            for inside in [first, last] {
                let ip = Ipv6Addr::from(inside);
                assert_eq!(classify_v6(ip), C::CloudHostService, "{ip}");
                assert!(classify(IpAddr::V6(ip)).is_always_denied(), "{ip}");
            }
            for outside in [first - 1, last + 1] {
                let ip = Ipv6Addr::from(outside);
                if is_cloud_host_service_v6(ip) {
                    continue; // the next entry of the table
                }
                let class = classify_v6(ip);
                assert_ne!(class, C::CloudHostService, "{ip}");
                assert!(!class.is_always_denied(), "{ip} is {class}");
            }
        }
    }
}
