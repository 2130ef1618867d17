//! Cloud host services on public addresses (docs/threat-model.md "Cloud
//! host services"): never reachable, whatever the policy allows around them.

use super::*;

/// Azure's WireServer address (DNS, DHCP, health probes and the VM agent's
/// channel on every Azure VM): public, yet a host service.
const WIRESERVER: Ipv4Addr = Ipv4Addr::new(168, 63, 129, 16);
/// Its public neighbour: the control, opened by the same `cidr` rule.
const WIRESERVER_NEIGHBOUR: Ipv4Addr = Ipv4Addr::new(168, 63, 129, 17);
/// The WireServer's agent port.
const WIRESERVER_PORT: u16 = 32526;

#[test]
#[ignore = "needs root: run via scripts/test"]
fn cloud_host_services_on_public_addresses_are_never_reachable() -> Result<()> {
    // The suite's policy plus a `cidr` rule around the WireServer.
    let policy = POLICY.replace(
        "internal:\n",
        &format!("  - cidr: 168.63.0.0/16\n    ports: [80, {WIRESERVER_PORT}]\ninternal:\n"),
    );
    ensure!(policy != POLICY, "the cidr rule was not added");
    let w = World::builder()
        .policy(&policy)
        .dns_record("wire.rebind.test", WIRESERVER)
        .dns_record("near.rebind.test", WIRESERVER_NEIGHBOUR)
        .dns_record("meta.rebind.test", Ipv4Addr::new(169, 254, 169, 254))
        .start()?;
    // Both addresses exist inside this test's fake internet (its own
    // namespace; the host namespace routes everything there), served by the
    // origin on 80 and by a TCP listener on the agent port that records
    // whatever arrives.
    for a in [WIRESERVER, WIRESERVER_NEIGHBOUR] {
        w.inet
            .ip(&["addr", "add", &format!("{a}/32"), "dev", "lo"])?;
    }
    let got = w.dir().join("wireserver-agent.out");
    let mut c = w.inet.cmd("socat");
    c.arg("-u")
        .arg(format!(
            "TCP4-LISTEN:{WIRESERVER_PORT},bind={WIRESERVER},reuseaddr,fork"
        ))
        .arg(format!("OPEN:{},creat,append", got.display()));
    let _agent =
        sluice_e2e::Proc::spawn("wireserver listener", &mut c, &w.dir().join("agent.log"))?;
    w.inet.wait_listening(
        "the WireServer listener",
        "tcp",
        &format!("{WIRESERVER}:{WIRESERVER_PORT}"),
    )?;

    // (1) A literal connect under a `cidr` rule that contains it: refused at
    // the SYN, audited platform_denied, on HTTP and on the agent port.
    guest_denied(
        &w,
        &format!("curl -sS --max-time 60 http://{WIRESERVER}/echo/wireserver"),
        "WireServer over HTTP",
        &format!("{WIRESERVER}:80"),
        &["platform_denied"],
    )?;
    guest_denied(
        &w,
        &format!("echo agent-hello | nc -w 20 {WIRESERVER} {WIRESERVER_PORT}"),
        "WireServer agent port",
        &format!("{WIRESERVER}:{WIRESERVER_PORT}"),
        &["platform_denied"],
    )?;

    // (2) An allowed name that resolves to it gets no usable answer, exactly
    // as a name answered with the link-local metadata address (the record
    // dropped, the empty answer REFUSED, the same audit reason), and a
    // connect by that name, pinned to the address, is refused too.
    let mut reasons = Vec::new();
    for (name, addr) in [
        ("wire.rebind.test", WIRESERVER),
        ("meta.rebind.test", Ipv4Addr::new(169, 254, 169, 254)),
    ] {
        let out = dig(&w, &format!("{name} A"))?;
        ensure!(
            out.contains("status: REFUSED") && !out.contains(&addr.to_string()),
            "{name} -> {addr}: {out}"
        );
        let line = expect_deny(
            &w,
            "a dropped answer",
            &["private_answer", "platform_denied"],
            |l| l["qname"] == name,
        )?;
        reasons.push(line["reason"].clone());
    }
    ensure!(
        reasons[0] == reasons[1],
        "the WireServer answer and the link-local one are audited differently: {reasons:?}"
    );
    let c = w.guest_sh(
        &format!(
            "curl -sS --max-time 60 --resolve wire.rebind.test:80:{WIRESERVER} \
             http://wire.rebind.test/echo/wireserver-by-name"
        ),
        90,
    )?;
    ensure!(!c.status.success(), "wire.rebind.test fetched");

    // Control: the neighbour, by literal and by name, is opened by the same
    // rules, so the refusals above are about the address alone.
    let ok = w.guest_ok(
        &format!("curl -sS --max-time 60 http://{WIRESERVER_NEIGHBOUR}/echo/neighbour"),
        90,
    )?;
    ensure!(ok.contains("/echo/neighbour"), "neighbour: {ok}");
    let near = dig(&w, "near.rebind.test A")?;
    ensure!(
        near.contains("status: NOERROR") && near.contains(&WIRESERVER_NEIGHBOUR.to_string()),
        "near.rebind.test: {near}"
    );

    // Nothing reached the WireServer's address: not the origin (which
    // serves it on 80), not the agent-port listener.
    ensure!(
        !origin_saw(&w, "/echo/wireserver") && !origin_saw(&w, "/echo/wireserver-by-name"),
        "the WireServer address was reached: {:?}",
        w.origin_requests()
    );
    let data = std::fs::read(&got).unwrap_or_default();
    ensure!(data.is_empty(), "the agent port received {data:?}");
    Ok(())
}
