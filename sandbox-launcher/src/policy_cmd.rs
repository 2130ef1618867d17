//! `sluice policy check` and `sluice policy explain`: validate a policy file
//! and show how it decides a name, port and address.
//!
//! Exit codes: `check` exits 0 when every file is valid and 1 otherwise
//! (each error printed to stderr as `file:line:col: message`). `explain`
//! exits 0 when the final verdict is allow, 3 when it is deny, and 1 when the
//! policy itself is invalid. Usage errors exit 2 (clap).

use std::net::IpAddr;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde::Serialize;
use sluice_policy::{
    CompileOptions, CompiledPolicy, Decision, PortProtocol, Reason, Transport, Verdict,
    normalize_name, platform,
};

/// Exit status: the final verdict of `explain` is deny.
pub const EXIT_DENIED: i32 = 3;
/// Exit status: the policy file is invalid or unreadable.
pub const EXIT_INVALID: i32 = 1;

/// `sluice policy ...`
#[derive(Debug, Subcommand)]
pub enum PolicyCmd {
    /// Validate policy files: exit 0 when valid, else print every error as
    /// `file:line:col: message` and exit 1.
    Check(CheckArgs),
    /// Show the verdict for a name (and optionally a port and an address) and
    /// the rule that decided it.
    Explain(ExplainArgs),
}

/// Arguments of `sluice policy check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Policy files to validate.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

/// Arguments of `sluice policy explain`.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("target").required(true).multiple(true).args(["name", "ip"]))]
pub struct ExplainArgs {
    /// The policy file.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// The name asked for (DNS query, SNI, Host).
    #[arg(long)]
    pub name: Option<String>,
    /// The destination port (default 443).
    #[arg(long, default_value_t = 443)]
    pub port: u16,
    /// The destination address; with --name, it is treated as resolved for
    /// that name (as the gateway's DNS table would record it).
    #[arg(long)]
    pub ip: Option<IpAddr>,
    /// Check UDP instead of TCP.
    #[arg(long)]
    pub udp: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Run a `sluice policy` subcommand; returns the exit status.
#[must_use]
pub fn main(cmd: PolicyCmd) -> i32 {
    match cmd {
        PolicyCmd::Check(args) => check(&args),
        PolicyCmd::Explain(args) => explain(&args),
    }
}

fn check(args: &CheckArgs) -> i32 {
    let mut status = 0;
    for file in &args.files {
        match sluice_policy::load_file(file, &CompileOptions::default()) {
            Ok(p) => println!(
                "{}: ok (id {}, version {}, {} domain rules)",
                file.display(),
                p.id(),
                p.version_hash(),
                p.domain_rule_count()
            ),
            Err(errors) => {
                for e in errors.errors() {
                    eprintln!("{e}");
                }
                eprintln!(
                    "{}: {} error{}",
                    file.display(),
                    errors.len(),
                    if errors.len() == 1 { "" } else { "s" }
                );
                status = EXIT_INVALID;
            }
        }
    }
    status
}

/// A verdict as printed.
#[derive(Debug, Serialize)]
struct VerdictOut<'a> {
    decision: Decision,
    reason: Reason,
    #[serde(skip_serializing_if = "Option::is_none")]
    rule_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pattern: Option<&'a str>,
}

impl<'a> From<Verdict<'a>> for VerdictOut<'a> {
    fn from(v: Verdict<'a>) -> Self {
        Self {
            decision: v.decision,
            reason: v.reason,
            rule_id: v.rule.map(|r| r.id),
            pattern: v.rule.map(|r| r.pattern),
        }
    }
}

impl std::fmt::Display for VerdictOut<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.decision, self.reason)?;
        if let (Some(id), Some(p)) = (self.rule_id, self.pattern) {
            write!(f, " by rule {id} `{p}`")?;
        }
        Ok(())
    }
}

/// The whole explanation, as printed with `--json`.
#[derive(Debug, Serialize)]
struct Explanation<'a> {
    policy_id: &'a str,
    policy_version: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    normalized_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dns: Option<VerdictOut<'a>>,
    transport: Transport,
    port: u16,
    port_protocol: Option<PortProtocol>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name_on_port: Option<VerdictOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ip: Option<IpAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    address_class: Option<platform::AddressClass>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dns_answer: Option<VerdictOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    destination: Option<VerdictOut<'a>>,
    inspected: bool,
    secrets: Vec<&'a str>,
    /// `unlisted: ask` and a plain allowlist miss: the gateway would hold
    /// the DNS query and ask the approval backend.
    would_ask: bool,
    /// Whether a WebSocket upgrade to the name passes the secrets' rule
    /// (every bound secret opted in); absent when no secret is bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    websocket: Option<bool>,
    verdict: VerdictOut<'a>,
}

fn explain(args: &ExplainArgs) -> i32 {
    let policy: CompiledPolicy =
        match sluice_policy::load_file(&args.file, &CompileOptions::default()) {
            Ok(p) => p,
            Err(errors) => {
                for e in errors.errors() {
                    eprintln!("{e}");
                }
                return EXIT_INVALID;
            }
        };
    let transport = if args.udp {
        Transport::Udp
    } else {
        Transport::Tcp
    };
    let name = args.name.as_deref();
    let normal = name.map(normalize_name);
    let dns = name.map(|n| VerdictOut::from(policy.check_name(n)));
    let name_on_port =
        name.map(|n| VerdictOut::from(policy.check_name_port(n, transport, args.port)));
    let names: Vec<&str> = name.into_iter().collect();
    let destination = args.ip.map(|ip| {
        VerdictOut::from(match transport {
            Transport::Tcp => policy.check_destination(ip, args.port, &names),
            Transport::Udp => policy.check_udp(ip, args.port, &names),
        })
    });
    let dns_answer = args
        .ip
        .map(|ip| VerdictOut::from(policy.check_dns_answer(ip)));
    // The final verdict: the destination check when an address is given (it
    // includes the name), else the name on the port.
    let final_verdict = match (args.ip, name) {
        (Some(ip), _) => match transport {
            Transport::Tcp => policy.check_destination(ip, args.port, &names),
            Transport::Udp => policy.check_udp(ip, args.port, &names),
        },
        (None, Some(n)) => policy.check_name_port(n, transport, args.port),
        (None, None) => Verdict::of(Reason::NotAllowlisted),
    };
    let ex = Explanation {
        policy_id: policy.id(),
        policy_version: policy.version_hash(),
        name,
        normalized_name: normal
            .as_ref()
            .and_then(|r| r.as_ref().ok())
            .map(ToString::to_string),
        name_error: normal
            .as_ref()
            .and_then(|r| r.as_ref().err())
            .map(ToString::to_string),
        dns,
        transport,
        port: args.port,
        port_protocol: (transport == Transport::Tcp).then(|| policy.port_protocol(args.port)),
        name_on_port,
        ip: args.ip,
        address_class: args.ip.map(platform::classify),
        dns_answer,
        destination,
        inspected: name.is_some_and(|n| policy.inspect_host(n)),
        secrets: name
            .map(|n| {
                policy
                    .secrets_for_host(n)
                    .map(|s| s.name.as_str())
                    .collect()
            })
            .unwrap_or_default(),
        would_ask: name.is_some_and(|n| policy.would_ask(n)),
        websocket: name
            .filter(|n| policy.secrets_for_host(n).next().is_some())
            .map(|n| policy.websocket_allowed(n)),
        verdict: final_verdict.into(),
    };
    if args.json {
        match serde_json::to_string_pretty(&ex) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("sluice: cannot serialise the explanation: {e}");
                return EXIT_INVALID;
            }
        }
    } else {
        print_text(&ex);
    }
    if final_verdict.is_allowed() {
        0
    } else {
        EXIT_DENIED
    }
}

fn print_text(ex: &Explanation<'_>) {
    println!("policy:      {} ({})", ex.policy_id, ex.policy_version);
    if let Some(n) = ex.name {
        match (&ex.normalized_name, &ex.name_error) {
            (Some(norm), _) if norm != n => println!("name:        {n} (normalised: {norm})"),
            (_, Some(err)) => println!("name:        {n} (invalid: {err})"),
            _ => println!("name:        {n}"),
        }
    }
    if let Some(v) = &ex.dns {
        println!("dns query:   {v}");
    }
    let proto = match (ex.transport, ex.port_protocol) {
        (Transport::Udp, _) => "udp".to_owned(),
        (Transport::Tcp, Some(p)) => format!("tcp, {}", port_protocol_name(p)),
        (Transport::Tcp, None) => "tcp".to_owned(),
    };
    if let Some(v) = &ex.name_on_port {
        println!("{:<13}{v} [{proto}]", format!("port {}:", ex.port));
    }
    if let (Some(ip), Some(class)) = (ex.ip, ex.address_class) {
        println!("address:     {ip} ({class})");
    }
    if let Some(v) = &ex.dns_answer {
        println!("dns answer:  {v}");
    }
    if let Some(v) = &ex.destination {
        println!("connect:     {v}");
    }
    if ex.name.is_some() {
        let secrets = if ex.secrets.is_empty() {
            "none".to_owned()
        } else {
            ex.secrets.join(", ")
        };
        let websocket = match ex.websocket {
            Some(true) => "; websocket: allowed, every secret opted in",
            Some(false) => "; websocket: refused, a secret did not opt in",
            None => "",
        };
        println!(
            "inspect:     {} (secrets: {secrets}{websocket})",
            if ex.inspected { "yes" } else { "no" }
        );
    }
    if ex.would_ask {
        println!("unlisted:    would ask (the approval backend decides; until then: deny)");
    }
    println!("verdict:     {}", ex.verdict);
}

fn port_protocol_name(p: PortProtocol) -> &'static str {
    match p {
        PortProtocol::Tls => "TLS (SNI checked)",
        PortProtocol::Http => "plain HTTP (Host checked)",
        PortProtocol::Tcp => "raw TCP",
    }
}
