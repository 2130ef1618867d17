//! The kernel floor under the gateway's own egress, as `sluice run`
//! installs it (docs/isolation.md "The egress floor").
//!
//! As root, each gateway runs with a gid of its own
//! ([`GATEWAY_GID_BASE`] + the launcher's pid: no two running launchers
//! share one, and no group of that id needs to exist). Before the gateway
//! starts, an nftables table in the launcher's network namespace drops
//! every packet a socket of that gid sends to loopback, link-local, the
//! host's own addresses, cloud host services and the non-public ranges,
//! except the networks the policy names and its DNS resolvers on their
//! port. A compromised gateway then still cannot reach the metadata
//! service or the host's services: the kernel refuses what its seccomp
//! and Landlock layers let through.
//!
//! The table outlives the launcher's own death: the gateway's jail
//! supervisor removes it after the gateway has ended
//! ([`crate::jail::JailSpec::egress_floor`]). When the policy file changes
//! and the gateway applies it, the launcher reinstalls the floor from the
//! new policy (one nft transaction replaces the table), so a network a
//! reload names is reachable and one it drops is not (`run::gateway`: off
//! the audit reader, at most once a second, only for a changed file).
//!
//! A policy whose approval backend is a webhook (without `--ask`, and
//! only under `unlisted: ask`) gets the webhook's addresses (at most 8)
//! opened on its port for TCP only, exactly and nothing else of their
//! networks (the webhook is often on loopback or a private address). The
//! host is resolved once, here, and the gateway is pinned to the same
//! addresses ([`pin_webhook`]); a reinstall reuses them. A link-local or
//! cloud host service, unspecified, multicast or broadcast address is
//! never opened; loopback and the host's own addresses only when the URL
//! names the address itself (a name that resolves there opens nothing).
//!
//! Rootless there is no floor: nftables in the host's namespace needs
//! root. The run reports it off, with that reason.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs as _};
use std::path::Path;

use anyhow::{Context, anyhow};
use ipnet::IpNet;
use sluice_approval::backend::webhook::{WebhookPin, url_host_port};
use sluice_floor::egress::{EgressFloor, EgressSpec, Owner, always_denied, non_public};
use sluice_gateway::metrics::{MetricsAddr, MetricsListener};
use sluice_policy::platform::{CLOUD_HOST_SERVICES_V4, CLOUD_HOST_SERVICES_V6};
use sluice_policy::{ApprovalBackend, CompiledPolicy, Unlisted, Upstream};

use crate::jail::Layer;

/// The first gid `sluice run` gives a gateway (as root); the launcher's
/// pid is added. The range (0x7100_0000 up to 0x7100_0000 + 4 times the
/// kernel's largest pid) lies between systemd's container and foreign
/// ranges.
pub(crate) const GATEWAY_GID_BASE: u32 = 0x7100_0000;

/// The kernel's largest possible pid count (`PID_MAX_LIMIT`): the stride
/// between the candidate gids of one pid.
const PID_SPAN: u32 = 1 << 22;

/// The gid of this launcher's gateway, chosen once: [`GATEWAY_GID_BASE`] +
/// the launcher's pid, unless a floor for that gid is already installed
/// here (a launcher of the same pid in another PID namespace sharing this
/// network namespace, or a run whose supervisor was killed), then the same
/// pid in the next of four strides.
pub(crate) fn gateway_gid() -> u32 {
    static GID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *GID.get_or_init(|| {
        let pid = std::process::id();
        let mut candidates = (0..4u32).map(|k| {
            GATEWAY_GID_BASE
                .saturating_add(k.saturating_mul(PID_SPAN))
                .saturating_add(pid)
        });
        let free = |gid: &u32| {
            !matches!(
                sluice_floor::egress::is_installed(None, Owner::Gid(*gid)),
                Ok(true)
            )
        };
        candidates
            .find(free)
            .unwrap_or(GATEWAY_GID_BASE.saturating_add(pid))
    })
}

/// Binds the gateway's `--metrics` listener for it. As root the socket is
/// created by a thread running with the gateway's gid: the floor matches a
/// socket by the credentials it was created with, and a listener the
/// gateway inherits could otherwise be turned back into a client socket
/// (`shutdown`, then `connect`) that no floor rule matches. Rootless there
/// is no floor and the socket is the caller's.
///
/// # Errors
/// The bind's, or the thread's set-up.
pub(crate) fn bind_metrics(addr: &MetricsAddr) -> std::io::Result<MetricsListener> {
    if crate::jail::is_rootless() {
        return MetricsListener::bind(addr);
    }
    let gid = gateway_gid();
    std::thread::scope(|s| {
        s.spawn(|| {
            // This thread's credentials only (not the process's): the
            // socket below is created with them, then the thread ends.
            rustix::thread::set_thread_gid(rustix::process::Gid::from_raw(gid))?;
            MetricsListener::bind(addr)
        })
        .join()
        .map_err(|_| std::io::Error::other("the metrics bind thread panicked"))?
    })
}

/// The resolvers the gateway forwards to under `policy`: its
/// `dns.upstream`, else the host's (as the gateway itself reads them).
///
/// # Errors
/// The policy names none and the host has no usable resolver.
fn resolvers(policy: &CompiledPolicy) -> anyhow::Result<Vec<SocketAddr>> {
    match policy.upstream_resolvers() {
        Upstream::Servers(s) => Ok(s.clone()),
        Upstream::System => sluice_gateway::config::host_resolvers()
            .map_err(|e| anyhow!("the egress floor's resolvers: {e}")),
    }
}

/// The most addresses of the approval webhook's host the floor opens.
const MAX_WEBHOOK_ADDRS: usize = 8;

/// The approval webhook of `policy` pinned for this run, on a host whose
/// own addresses are `host`: the URL's host resolved here, once, and the
/// addresses the floor may open on the URL's port (TCP only, at most
/// [`MAX_WEBHOOK_ADDRS`]). The gateway is passed the same pin and connects
/// only there (`--approval-webhook-addr`), so what the floor opens and what
/// the gateway reaches are one set.
///
/// `None` when the gateway does not post to a webhook: another backend,
/// or `--ask` (`ask`), whose prompt answers instead. A pin with no address
/// when nothing will ask (`unlisted: deny`: not even resolved), when the
/// host does not resolve (every question is then denied), or when
/// [`webhook_refusal`] refuses every address (the metadata service,
/// loopback reached through a name, ...); each refusal said on stderr.
///
/// Resolved once: a reload that changes the webhook's host or turns
/// `unlisted: ask` on does not move the pin (docs/approval.md: a restart
/// does).
pub(crate) fn pin_webhook(
    policy: &CompiledPolicy,
    host: &[IpAddr],
    ask: bool,
) -> Option<WebhookPin> {
    let Some(ApprovalBackend::Webhook { url, .. }) = policy.approval().map(|a| &a.backend) else {
        return None;
    };
    if ask {
        return None;
    }
    let (name, port) = url_host_port(url).ok()?;
    let mut pin = WebhookPin {
        host: name.clone(),
        addrs: Vec::new(),
    };
    if policy.unlisted() != Unlisted::Ask {
        return Some(pin);
    }
    let literal = name.parse::<IpAddr>().ok();
    let resolved = match (name.as_str(), port).to_socket_addrs() {
        Ok(a) => a,
        Err(e) => {
            eprintln!(
                "sluice: approval webhook {name}: {e}; the gateway's egress floor opens nothing for it"
            );
            return Some(pin);
        }
    };
    for a in resolved {
        let ip = unmapped(a.ip());
        if let Some(why) = webhook_refusal(ip, literal.map(unmapped) == Some(ip), host) {
            eprintln!(
                "sluice: approval webhook {name} is at {ip}, {why}: the gateway's egress floor \
                 does not open it"
            );
        } else if pin.addrs.len() == MAX_WEBHOOK_ADDRS {
            eprintln!(
                "sluice: approval webhook {name}: only its first {MAX_WEBHOOK_ADDRS} addresses \
                 are opened; {ip} is not"
            );
        } else if !pin.addrs.contains(&SocketAddr::new(ip, port)) {
            pin.addrs.push(SocketAddr::new(ip, port));
        }
    }
    Some(pin)
}

/// `ip`, or the IPv4 address it maps.
fn unmapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// Why the floor does not open the webhook's address `ip` (`literal`: the
/// URL names that address itself; `host`: this host's own addresses), or
/// `None`. Never: link-local and cloud host services, unspecified,
/// multicast and broadcast addresses. Loopback and the host's own
/// addresses only when the URL names them literally: a DNS answer must not
/// open what no policy opens.
fn webhook_refusal(ip: IpAddr, literal: bool, host: &[IpAddr]) -> Option<&'static str> {
    let never = cloud_host_services().chain(
        ["169.254.0.0/16", "fe80::/10"]
            .iter()
            .filter_map(|n| n.parse().ok()),
    );
    let nowhere = match ip {
        IpAddr::V4(v4) => v4.octets()[0] == 0 || v4.is_multicast() || v4.is_broadcast(),
        IpAddr::V6(v6) => v6.is_unspecified() || v6.is_multicast(),
    };
    if never.into_iter().any(|n: IpNet| n.contains(&ip)) {
        Some("a link-local or cloud host service address")
    } else if nowhere {
        Some("an unspecified, multicast or broadcast address")
    } else if !literal && (ip.is_loopback() || host.contains(&ip)) {
        Some(
            "loopback or this host's own address, reached through a name (name the address itself in the URL to open it)",
        )
    } else {
        None
    }
}

/// Cloud host services: always dropped (the policy cannot name them).
fn cloud_host_services() -> impl Iterator<Item = IpNet> {
    let v4 = CLOUD_HOST_SERVICES_V4
        .iter()
        .filter_map(|&(ip, len)| ipnet::Ipv4Net::new(ip, len).ok().map(IpNet::V4));
    let v6 = CLOUD_HOST_SERVICES_V6
        .iter()
        .filter_map(|&(ip, len)| ipnet::Ipv6Net::new(ip, len).ok().map(IpNet::V6));
    v4.chain(v6)
}

/// What the gateway listens on and asks besides the policy's networks.
#[derive(Debug, Clone, Default)]
pub(crate) struct Openings {
    /// Its published host ports and a TCP metrics port: its replies from
    /// them are not its own egress.
    pub(crate) reply_ports: Vec<u16>,
    /// The approval webhook's pinned addresses ([`pin_webhook`]), the same
    /// at every reinstall: the floor never resolves the webhook again.
    pub(crate) webhook: Vec<SocketAddr>,
}

/// What the floor holds the gateway of gid `gid` to, under `policy`, on a
/// host whose own addresses are `host`, with the `webhook` addresses
/// ([`pin_webhook`]) and the `reply_ports` opened.
///
/// # Errors
/// As for [`resolvers`].
pub(crate) fn spec(
    policy: &CompiledPolicy,
    host: &[IpAddr],
    gid: u32,
    reply_ports: &[u16],
    webhook: &[SocketAddr],
) -> anyhow::Result<EgressSpec> {
    Ok(EgressSpec {
        owner: Owner::Gid(gid),
        reply_ports: reply_ports.to_vec(),
        resolvers: resolvers(policy)?,
        // The webhook's exact address and port, TCP only (accepted before
        // anything is dropped).
        tcp_only: webhook.to_vec(),
        // What no policy opens (loopback, link-local, multicast, the host's
        // addresses, cloud host services) before anything the policy names:
        // the gateway's own check denies them whatever the policy says, and
        // so does the floor, however broad a `cidr:` rule is.
        deny_first: always_denied()
            .into_iter()
            .chain(host.iter().map(|&ip| IpNet::from(ip)))
            .chain(cloud_host_services())
            .collect(),
        allow: policy.named_networks().collect(),
        deny: non_public(),
    })
}

/// Installs the floor for `gid` under the policy at `policy_path` (already
/// compiled as `policy`), in the launcher's namespace.
///
/// # Errors
/// `nft` is missing or fails, or the rules read back differ: one line
/// saying so.
pub(crate) fn install(
    policy: &CompiledPolicy,
    gid: u32,
    open: &Openings,
) -> anyhow::Result<EgressFloor> {
    let host = sluice_gateway::decide::host_addresses();
    let spec = spec(policy, &host, gid, &open.reply_ports, &open.webhook)?;
    EgressFloor::install(None, &spec).map_err(|e| anyhow!("the gateway's egress floor: {e}"))
}

/// Reinstalls the floor for `gid` from the policy file at `path` (after the
/// gateway applied a reload). The gateway has already validated the file;
/// a file that no longer compiles leaves the floor as it was.
///
/// # Errors
/// The file does not compile, or `nft` fails.
pub(crate) fn refresh(path: &Path, gid: u32, open: &Openings) -> anyhow::Result<()> {
    let policy = sluice_policy::load_file(path, &sluice_policy::CompileOptions::default())
        .map_err(|e| anyhow!("{e}"))
        .with_context(|| format!("recompiling {} for the egress floor", path.display()))?;
    // Replaced in one transaction; the supervisor still owns its removal.
    let floor = install(&policy, gid, open)?;
    let _table = floor.hand_off();
    Ok(())
}

/// The egress floor for this run's gateway, and how the run reports it:
/// as root, installed (or refused in one line unless
/// `--allow-missing-isolation nftables`); rootless, off.
pub(crate) fn install_for_run(
    policy: &CompiledPolicy,
    allow_missing: &std::collections::BTreeSet<Layer>,
    open: &Openings,
) -> anyhow::Result<(Option<EgressFloor>, String)> {
    if crate::jail::is_rootless() {
        return Ok((
            None,
            "off: rootless (nftables in the host's network namespace needs root)".to_owned(),
        ));
    }
    let gid = gateway_gid();
    match install(policy, gid, open) {
        Ok(floor) => {
            // The addresses installed, not a second resolution.
            for a in &open.webhook {
                eprintln!(
                    "sluice: the gateway's egress floor lets it reach the approval webhook \
                     at {a} (that address and port only)"
                );
            }
            let status = format!(
                "on: nftables table inet {} drops the gateway's (gid {gid}) packets to \
                 loopback, link-local, host and non-public addresses the policy does not name",
                floor.table()
            );
            Ok((Some(floor), status))
        }
        Err(e) if allow_missing.contains(&Layer::Nftables) => {
            eprintln!("sluice: {e:#}; running without it (--allow-missing-isolation nftables)");
            Ok((
                None,
                format!("off: {e:#} (--allow-missing-isolation nftables)"),
            ))
        }
        Err(e) => Err(e.context(
            "refusing to run the gateway without its egress floor \
             (--allow-missing-isolation nftables runs without it)",
        )),
    }
}

/// What `sluice doctor` says of the floor: whether a run here gets it,
/// and why (`true` when it does or, rootless, cannot be asked for).
pub(crate) fn probe() -> (bool, String) {
    if crate::jail::is_rootless() {
        return (
            false,
            "rootless: nftables in the host's network namespace needs root".to_owned(),
        );
    }
    match std::process::Command::new("nft").arg("--version").output() {
        Ok(out) if out.status.success() => (
            true,
            format!(
                "root, {}: each gateway gets a gid of its own and a table dropping its \
                 packets to private, host and metadata addresses the policy does not name",
                String::from_utf8_lossy(&out.stdout).trim()
            ),
        ),
        Ok(out) => (
            false,
            format!(
                "`nft --version` failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ),
        Err(e) => (false, format!("nft: {e} (install nftables)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compile(yaml: &str) -> CompiledPolicy {
        sluice_policy::from_yaml_str(yaml, "test.yaml", &sluice_policy::CompileOptions::default())
            .unwrap()
    }

    #[test]
    fn the_spec_names_the_policy_networks_and_resolvers_and_drops_the_host() {
        let policy = compile(
            "version: 1\nid: t\nallow:\n  - domain: example.com\n  - cidr: 10.1.0.0/16\n    ports: [5432]\n\
             internal:\n  - 192.168.7.0/24\ndns:\n  upstream: [10.0.0.53, \"[fd00::53]:5353\"]\n",
        );
        let host: Vec<IpAddr> = vec!["10.1.2.3".parse().unwrap()];
        let hook: SocketAddr = "127.0.0.1:18443".parse().unwrap();
        let s = spec(&policy, &host, gateway_gid(), &[8080], &[hook]).unwrap();
        assert_eq!(s.reply_ports, vec![8080]);
        assert_eq!(s.owner, Owner::Gid(GATEWAY_GID_BASE + std::process::id()));
        assert_eq!(
            s.resolvers,
            vec![
                "10.0.0.53:53".parse::<SocketAddr>().unwrap(),
                "[fd00::53]:5353".parse().unwrap(),
            ]
        );
        // The webhook: TCP only, never by the resolvers' UDP-and-TCP rule.
        assert_eq!(s.tcp_only, vec![hook]);
        let allow: Vec<String> = s.allow.iter().map(ToString::to_string).collect();
        assert!(allow.contains(&"192.168.7.0/24".to_owned()), "{allow:?}");
        assert!(allow.contains(&"10.1.0.0/16".to_owned()), "{allow:?}");
        // The host's address is dropped first, though a policy network
        // holds it; so are cloud host services (Azure's WireServer).
        assert!(s.deny_first.contains(&"10.1.2.3/32".parse().unwrap()));
        assert!(s.deny_first.contains(&"168.63.129.16/32".parse().unwrap()));
        // What no policy opens is dropped before the policy's networks.
        assert!(s.deny_first.contains(&"169.254.0.0/16".parse().unwrap()));
        assert!(s.deny_first.contains(&"127.0.0.0/8".parse().unwrap()));
        assert!(s.deny.contains(&"10.0.0.0/8".parse().unwrap()));
    }

    #[test]
    fn a_webhook_is_opened_at_its_address_and_port_only() {
        for (url, want) in [
            ("https://127.0.0.1:18443/ask", Some(("127.0.0.1", 18443))),
            ("http://10.0.0.5/ask?x=1", Some(("10.0.0.5", 80))),
            ("https://[::1]:9000/", Some(("::1", 9000))),
            ("HTTPS://hook.example:8443", Some(("hook.example", 8443))),
            ("https://u:p@10.0.0.5", Some(("10.0.0.5", 443))),
            ("ftp://10.0.0.5/", None),
            ("https://10.0.0.5:notaport/", None),
        ] {
            assert_eq!(
                url_host_port(url).ok(),
                want.map(|(h, p)| (h.to_owned(), p)),
                "{url}"
            );
        }
        let hooked = |url: &str| {
            compile(&format!(
                "version: 1\nid: t\nunlisted: ask\napproval:\n  backend:\n    webhook:\n      url: {url}\n"
            ))
        };
        let host: Vec<IpAddr> = vec!["192.0.2.7".parse().unwrap()];
        let webhook = |url: &str| {
            pin_webhook(&hooked(url), &host, false)
                .map(|p| p.addrs)
                .unwrap_or_default()
        };
        // Loopback and the host's own address, named literally: opened.
        assert_eq!(
            webhook("https://127.0.0.1:18443/ask"),
            vec!["127.0.0.1:18443".parse::<SocketAddr>().unwrap()]
        );
        assert_eq!(
            webhook("https://[::1]:18443/ask"),
            vec!["[::1]:18443".parse::<SocketAddr>().unwrap()]
        );
        assert_eq!(webhook("http://192.0.2.7:8080/").len(), 1);
        // `localhost` is a name: its loopback answer is not opened.
        assert!(webhook("http://localhost:18443/ask").is_empty());
        // The metadata service and link-local addresses: never opened.
        assert!(webhook("http://169.254.169.254/latest").is_empty());
        assert!(webhook("http://168.63.129.16/").is_empty());
        // Nowhere addresses: never, literal or not.
        for url in [
            "http://0.0.0.0:8080/",
            "http://0.1.2.3:8080/",
            "http://224.0.0.1:8080/",
            "http://255.255.255.255:8080/",
            "http://[::]:8080/",
            "http://[ff02::1]:8080/",
            "http://[::ffff:169.254.169.254]/",
        ] {
            assert!(webhook(url).is_empty(), "{url}");
        }
        assert_eq!(
            pin_webhook(&compile("version: 1\nid: t\n"), &host, false),
            None
        );
    }

    /// Under `unlisted: deny` nothing asks: the webhook is pinned to no
    /// address and the floor's spec opens none (the host is not even
    /// resolved). Under `--ask` the prompt answers: no pin at all.
    #[test]
    fn no_webhook_opening_when_nothing_will_ask_it() {
        let policy = |unlisted: &str| {
            compile(&format!(
                "version: 1\nid: t\nunlisted: {unlisted}\napproval:\n  backend:\n    webhook:\n      \
                 url: https://127.0.0.1:18443/ask\n"
            ))
        };
        let host: Vec<IpAddr> = vec!["192.0.2.7".parse().unwrap()];
        let hook: SocketAddr = "127.0.0.1:18443".parse().unwrap();
        let pin = pin_webhook(&policy("deny"), &host, false).unwrap();
        assert_eq!(pin.host, "127.0.0.1");
        assert!(pin.addrs.is_empty(), "{pin:?}");
        let s = spec(&policy("deny"), &host, gateway_gid(), &[], &pin.addrs).unwrap();
        assert!(s.tcp_only.is_empty(), "{:?}", s.tcp_only);
        // The same policy asking: exactly the webhook's address and port.
        let pin = pin_webhook(&policy("ask"), &host, false).unwrap();
        assert_eq!(pin.addrs, vec![hook]);
        let s = spec(&policy("ask"), &host, gateway_gid(), &[], &pin.addrs).unwrap();
        assert_eq!(s.tcp_only, vec![hook]);
        assert_eq!(pin_webhook(&policy("ask"), &host, true), None);
    }

    #[test]
    fn a_name_never_opens_loopback_or_the_host() {
        let host: Vec<IpAddr> = vec!["192.0.2.7".parse().unwrap()];
        for ip in ["127.0.0.1", "127.9.9.9", "::1", "192.0.2.7"] {
            let ip: IpAddr = ip.parse().unwrap();
            assert!(webhook_refusal(ip, false, &host).is_some(), "{ip}");
            assert_eq!(webhook_refusal(ip, true, &host), None, "{ip}");
        }
        let public: IpAddr = "203.0.113.9".parse().unwrap();
        assert_eq!(webhook_refusal(public, false, &host), None);
    }

    /// Every network the floor drops is one the policy crate calls
    /// non-public, and every non-public class has a network in it: the
    /// floor and the gateway's own check agree on what "private" means.
    #[test]
    fn the_floor_and_the_platform_classes_agree() {
        use sluice_policy::platform::{AddressClass, classify};
        for net in non_public() {
            for ip in [net.network(), net.broadcast()] {
                let embedded = match ip {
                    IpAddr::V6(v6) => sluice_policy::platform::embedded_v4(v6).is_some(),
                    IpAddr::V4(_) => false,
                };
                assert!(
                    classify(ip).is_non_public() || embedded,
                    "{net} ({ip}) is dropped by the floor but public to the policy"
                );
            }
        }
        // Every class no policy opens is dropped before the policy's
        // networks, and nothing a policy may open is among them.
        for net in always_denied() {
            for ip in [net.network(), net.broadcast()] {
                assert!(
                    classify(ip).is_always_denied(),
                    "{net} ({ip}) is dropped first but a policy may open it"
                );
            }
        }
        let samples = [
            "127.0.0.1",
            "0.1.2.3",
            "169.254.169.254",
            "224.0.0.251",
            "255.255.255.255",
            "10.9.8.7",
            "172.20.0.1",
            "192.168.1.1",
            "100.64.0.1",
            "198.18.0.1",
            "192.0.2.1",
            "198.51.100.7",
            "203.0.113.9",
            "192.0.0.8",
            "192.88.99.1",
            "240.0.0.1",
            "::1",
            "::",
            "fe80::1",
            "fec0::1",
            "fd00::1",
            "ff02::1",
            "2001::1",
            "2001:db8::1",
            "2001:2::1",
            "3fff::1",
            "100::1",
            "64:ff9b::a00:5",
            "64:ff9b:1::a00:5",
            "2002:a00:5::1",
        ];
        let nets: Vec<IpNet> = always_denied().into_iter().chain(non_public()).collect();
        for s in samples {
            let ip: IpAddr = s.parse().unwrap();
            let embedded = match ip {
                IpAddr::V6(v6) => sluice_policy::platform::embedded_v4(v6).is_some(),
                IpAddr::V4(_) => false,
            };
            assert!(classify(ip) != AddressClass::Public || embedded, "{s}");
            assert!(
                nets.iter().any(|n| n.contains(&ip)),
                "{s} ({}) is non-public to the policy but not dropped by the floor",
                classify(ip)
            );
        }
    }
}
