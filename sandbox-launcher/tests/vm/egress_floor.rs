//! The kernel floor under the gateway's own egress, inside a real run
//! (issue 13, point 3).

use super::*;

/// The kernel floor under the gateway's own egress (issue 13, point 3).
/// While `sluice run` holds a guest that fetched an allowed name, a rogue
/// process with the gateway's identity (uid 65534 and the gateway's own
/// gid) cannot connect (the kernel drops its SYN, counted by the floor) to loopback
/// and the host's own address, while the same process with another gid
/// connects; it still reaches the origin the policy names. Afterwards the
/// guest fetches again (the real gateway's traffic flows under the floor),
/// and the floor is gone once the run ends; a second run killed with
/// SIGKILL mid-flow leaves no floor either. The run also serves its
/// gateway's metrics on loopback TCP (`--metrics 127.0.0.1:PORT`), scraped
/// while it lasts: the gateway's replies from its listening port pass the
/// floor that drops everything else it sends to loopback.
#[test]
#[ignore = "needs root: run via scripts/test"]
fn the_gateways_egress_floor_stops_a_rogue_process_under_its_identity() {
    use sluice_e2e::{HOST_VETH_ADDR, ORIGIN_ADDR, ORIGIN_NAME};
    let Some(rw) = RunWorld::start() else { return };
    let (agent, gateway, world) = (rw.agent, rw.gateway, rw.world);
    let dir = world.dir().to_path_buf();
    let policy = dir.join("la-floor-policy.yaml");
    fs::write(
        &policy,
        format!(
            "version: 1\nid: la-vm-floor\nallow:\n  - domain: {ORIGIN_NAME}\n{}",
            world_policy_tail()
        ),
    )
    .unwrap();
    // A listener in the harness's host namespace, on every address: on
    // loopback and on the host's own address (both private to the floor).
    let port = 18_731u16;
    let mut listener = world
        .host
        .cmd("/usr/bin/python3")
        .args([
            "-c",
            &format!(
                "import socket\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
                 s.bind(('0.0.0.0',{port}))\ns.listen(64)\nprint('ready',flush=True)\n\
                 while True:\n    c,_=s.accept(); c.close()\n"
            ),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(listener.stdout.take().unwrap()),
        &mut ready,
    )
    .unwrap();
    assert_eq!(ready.trim(), "ready");

    let ca = world.ca_pem();
    let fetch =
        format!("curl -sS -o /dev/null --max-time 60 --cacert /tmp/ca.pem https://{ORIGIN_NAME}/");
    let script = format!("{fetch}; echo allowed=$?; read go; {fetch}; echo again=$?");
    // `sluice run --metrics` too: scraped while the guest waits, from
    // loopback in the world's host namespace.
    let metrics = "127.0.0.1:18732";
    let args = run_args(&["--metrics", metrics], &policy, &ca, script);
    let m = mark();
    let mut child = sluice_in_world(&world, &agent, &gateway, &m, &args, &[]);
    let launcher = child.id();
    let stderr = drain(child.stderr.take().unwrap());
    let (lines, reader) = line_reader(child.stdout.take().unwrap());
    wait_line(&lines, &stderr, 300, "the first fetch", |l| {
        l.starts_with("allowed=")
    });
    let gw = jailed_pid(launcher, "sluice-gateway").expect("the gateway runs");
    let gid = gateway_gid(gw);
    assert_eq!(gid, FLOOR_GID_BASE + launcher);
    // The jail's group stays a supplementary one (files shared with it).
    assert_eq!(status_field(gw, "Groups"), "65534");
    let table = floor_table(launcher);
    assert!(
        nft_tables(Some(world.host.name())).contains(&table),
        "no egress floor in the gateway's namespace"
    );
    // The gateway's metrics, through the socket `sluice run` bound for it:
    // the allowed fetch is counted (an inspected TLS flow: `sni`).
    let scrape = world
        .host
        .cmd("curl")
        .args(["-sS", "--max-time", "20"])
        .arg(format!("http://{metrics}/metrics"))
        .output()
        .unwrap();
    let scraped = text(&scrape.stdout);
    assert!(scrape.status.success(), "{}", text(&scrape.stderr));
    assert!(
        scraped
            .lines()
            .any(|l| l.starts_with("sluice_flows_opened_total{")
                && l.contains("decision=\"allow\"")
                && !l.ends_with(" 0")),
        "no allowed flow counted: {scraped}"
    );
    // The gateway's own process figures reach the scrape from inside its
    // jail (its /proc/self/status and /proc/self/fd are bound there).
    for series in [
        "sluice_process_resident_memory_bytes ",
        "sluice_process_open_fds ",
    ] {
        let value = scraped
            .lines()
            .find_map(|l| l.strip_prefix(series))
            .and_then(|v| v.trim().parse::<f64>().ok());
        assert!(
            value.is_some_and(|v| v > 0.0),
            "{series}missing or zero: {scraped}"
        );
    }

    // What a process of uid 65534 and gid `gid` gets connecting to `ip`.
    let connect = |gid: u32, ip: &str, port: u16| -> String {
        let code = format!(
            "import socket\ns=socket.socket()\ns.settimeout(5)\n\
             try:\n    s.connect(('{ip}',{port})); print('connected')\n\
             except OSError as e:\n    print('errno', e.errno)\n"
        );
        let out = world
            .host
            .cmd("setpriv")
            .args([
                "--reuid",
                "65534",
                "--regid",
                &gid.to_string(),
                "--clear-groups",
                "/usr/bin/python3",
                "-c",
                &code,
            ])
            .output()
            .unwrap();
        let got = text(&out.stdout).trim().to_owned();
        assert!(!got.is_empty(), "the probe failed: {}", text(&out.stderr));
        got
    };
    // The floor's drops: the counters of its rules, summed.
    let dropped = || -> u64 {
        floor_rules(world.host.name(), &table)
            .lines()
            .filter(|l| l.contains(" drop"))
            .filter_map(|l| {
                let n = l.split("packets ").nth(1)?.split_whitespace().next()?;
                n.parse::<u64>().ok()
            })
            .sum()
    };
    let host_addr = HOST_VETH_ADDR.to_string();
    for ip in ["127.0.0.1", host_addr.as_str()] {
        // The SYN is dropped: the connect never completes (a timeout, or
        // EPERM where the kernel reports the drop), and the floor counts it.
        let before = dropped();
        let got = connect(gid, ip, port);
        assert_ne!(got, "connected", "the gateway's gid reached {ip}");
        assert!(dropped() > before, "no drop counted for {ip}: {got}");
        assert_eq!(connect(65533, ip, port), "connected", "another gid to {ip}");
    }
    // The origin the policy names (`internal:`) stays reachable.
    assert_eq!(
        connect(gid, &ORIGIN_ADDR.to_string(), 443),
        "connected",
        "the gateway's gid to the origin the policy names"
    );

    // The real gateway still carries the guest's traffic.
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let status = child.wait().unwrap();
    let out = reader.join().unwrap();
    assert!(
        out.contains("allowed=0\n") && out.contains("again=0\n"),
        "stdout: {out}\nstderr: {}",
        stderr.lock().unwrap()
    );
    assert_eq!(status.code(), Some(0));
    assert_no_leftovers(&m, launcher);
    assert!(
        !nft_tables(Some(world.host.name())).contains(&table),
        "the floor stayed after the run"
    );

    // SIGKILL of the launcher mid-run: the gateway's supervisor removes it.
    let args = [
        "--policy".to_owned(),
        policy.display().to_string(),
        "--".to_owned(),
        "sh".to_owned(),
        "-c".to_owned(),
        "echo started; sleep 100000".to_owned(),
    ];
    let m = mark();
    let mut child = sluice_in_world(&world, &agent, &gateway, &m, &args, &[]);
    let launcher = child.id();
    let stderr = drain(child.stderr.take().unwrap());
    let (lines, _reader) = line_reader(child.stdout.take().unwrap());
    wait_line(&lines, &stderr, 300, "the command", |l| l == "started");
    let table = floor_table(launcher);
    assert!(nft_tables(Some(world.host.name())).contains(&table));
    Command::new("kill")
        .args(["-KILL", &launcher.to_string()])
        .status()
        .unwrap();
    child.wait().unwrap();
    assert_no_leftovers(&m, launcher);
    sluice_e2e::wait_until(
        "the floor removed after SIGKILL",
        Duration::from_secs(60),
        || !nft_tables(Some(world.host.name())).contains(&table),
    )
    .unwrap();
    let _ = listener.kill();
    let _ = listener.wait();
    drop(world);
}
