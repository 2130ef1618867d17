//! Secret injection inside a real VM (issue 5): the sandbox CA in the
//! guest's trust store, the values substituted on the way out.

use super::*;

const VC_TOK_PLACEHOLDER: &str = "sk-sluice-placeholder-vctok";
const VC_TOK_VALUE: &str = "REAL-vc-env-token-4f2a9c";
const VC_KEY_PLACEHOLDER: &str = "sk-sluice-placeholder-vckey";
const VC_KEY_VALUE: &str = "REAL-vc-file-key-81d3e7";

/// Issue 5 inside a real VM: a policy binds two secrets to the fake
/// internet's `origin.test` (one from an environment variable of `sluice`,
/// one from a file readable by the jail's group). The gateway generates a
/// sandbox CA (`--ca-out` in the run dir, read here while the command
/// waits on stdin); the agent installs it, so that inside the guest the
/// system bundle and the files named by `SSL_CERT_FILE` and
/// `CURL_CA_BUNDLE` hold it, and plain `curl https://origin.test/...`
/// (no `-k`, no `--cacert`) verifies the gateway's leaf. The origin
/// receives the real values, the guest sees only the placeholders (the
/// echo reflects the headers and the gateway scrubs them back), and the
/// audit log holds the `http` record with both secrets.
#[test]
#[ignore = "needs root: run via scripts/test"]
fn the_sandbox_ca_in_the_guest_trust_store_and_secrets_substituted() {
    use sluice_e2e::ORIGIN_NAME;
    let Some(rw) = RunWorld::start() else { return };
    let (agent, gateway, world) = (rw.agent, rw.gateway, rw.world);
    let secret_dir = jail_dir(&world, "vc-secrets");
    let key_file = secret_dir.join("key");
    fs::write(&key_file, format!("{VC_KEY_VALUE}\n")).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&key_file, fs::Permissions::from_mode(0o640)).unwrap();
        std::os::unix::fs::chown(&key_file, Some(0), Some(65534)).unwrap();
    }
    let policy = jail_dir(&world, "vc-policy").join("policy.yaml");
    fs::write(
        &policy,
        format!(
            "version: 1\nid: vc-vm-secrets\nallow:\n  - domain: {ORIGIN_NAME}\n\
             secrets:\n\
             \x20 - name: tok\n    placeholder: {VC_TOK_PLACEHOLDER}\n    env: VC_SLUICE_TOK\n\
             \x20   hosts: [\"{ORIGIN_NAME}\"]\n\
             \x20 - name: key\n    placeholder: {VC_KEY_PLACEHOLDER}\n    file: {}\n\
             \x20   hosts: [\"{ORIGIN_NAME}\"]\n{}",
            key_file.display(),
            world_policy_tail()
        ),
    )
    .unwrap();
    let audit = world.dir().join("vc-audit.jsonl");
    let out_dir = world.dir().join("vc-out");
    fs::create_dir_all(&out_dir).unwrap();
    let script = format!(
        "echo ready; read go; \
         echo \"ssl_cert_file=$SSL_CERT_FILE curl_ca_bundle=$CURL_CA_BUNDLE\"; \
         mkdir -p /tmp/out; \
         cat \"${{SSL_CERT_FILE:-/none}}\" > /tmp/out/ssl_cert_file.pem; \
         cat \"${{CURL_CA_BUNDLE:-/none}}\" > /tmp/out/curl_ca_bundle.pem; \
         cat /etc/ssl/certs/ca-certificates.crt > /tmp/out/system.pem; \
         cat /etc/sluice/sandbox-ca.pem > /tmp/out/sandbox-ca.pem; \
         curl -sS --max-time 60 -H 'Authorization: Bearer {VC_TOK_PLACEHOLDER}' \
         -H 'X-Api-Key: {VC_KEY_PLACEHOLDER}' https://{ORIGIN_NAME}/echo/vc-vm; \
         r=$?; echo; echo fetch=$r"
    );
    let mut args = vec![
        "--policy".to_owned(),
        policy.display().to_string(),
        "--upstream-ca".to_owned(),
        world.ca_pem().display().to_string(),
        "--audit".to_owned(),
        audit.display().to_string(),
    ];
    for f in ["ssl_cert_file", "curl_ca_bundle", "system", "sandbox-ca"] {
        args.push("--copy-out".to_owned());
        args.push(format!("/tmp/out/{f}.pem:{}/{f}.pem", out_dir.display()));
    }
    args.extend(["--", "sh", "-c", &script].map(str::to_owned));
    let m = mark();
    let mut child = sluice_in_world(
        &world,
        &agent,
        &gateway,
        &m,
        &args,
        &[("VC_SLUICE_TOK", VC_TOK_VALUE)],
    );
    let launcher = child.id();
    let (lines, stdout) = line_reader(child.stdout.take().unwrap());
    let stderr = drain(child.stderr.take().unwrap());
    let stdin = child.stdin.take().unwrap();

    // While the command waits: the CA the gateway wrote with --ca-out.
    wait_line(&lines, &stderr, 300, "the guest's `ready`", |l| {
        l == "ready"
    });
    let ca_path = std::env::temp_dir().join(format!("sluice-{launcher}.run/out/ca.pem"));
    let host_ca = fs::read_to_string(&ca_path).unwrap();
    let (stdout, stderr) = release_held_run(child, stdin, stdout, &stderr, &m);

    // It is the name-constrained sandbox CA, and nothing private.
    assert!(
        host_ca.starts_with("-----BEGIN CERTIFICATE-----") && !host_ca.contains("PRIVATE"),
        "{host_ca}"
    );
    fs::write(world.dir().join("vc-ca-copy.pem"), &host_ca).unwrap();
    let x509 = Command::new("openssl")
        .args(["x509", "-noout", "-text", "-in"])
        .arg(world.dir().join("vc-ca-copy.pem"))
        .output()
        .unwrap();
    let x509 = text(&x509.stdout);
    assert!(x509.contains("CA:TRUE"), "{x509}");
    assert!(
        x509.contains("Permitted") && x509.contains(ORIGIN_NAME),
        "no name constraint for {ORIGIN_NAME}: {x509}"
    );

    // Inside the guest: the CA alone, and in every bundle clients are told.
    let guest = |f: &str| fs::read_to_string(out_dir.join(format!("{f}.pem"))).unwrap();
    assert_eq!(guest("sandbox-ca"), host_ca, "/etc/sluice/sandbox-ca.pem");
    for f in ["system", "ssl_cert_file", "curl_ca_bundle"] {
        assert!(
            guest(f).contains(host_ca.trim()),
            "{f}: the sandbox CA is missing ({} bytes)",
            guest(f).len()
        );
    }
    assert!(
        stdout.contains(
            "ssl_cert_file=/etc/ssl/certs/ca-certificates.crt \
             curl_ca_bundle=/etc/ssl/certs/ca-certificates.crt"
        ),
        "{stdout}"
    );

    // curl verified the gateway's leaf by the trust store alone.
    assert!(
        stdout.contains("\nfetch=0\n"),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    // The guest saw the placeholders reflected, never the values.
    for p in [VC_TOK_PLACEHOLDER, VC_KEY_PLACEHOLDER] {
        assert!(stdout.contains(p), "{p} not reflected: {stdout}");
    }
    for v in [VC_TOK_VALUE, VC_KEY_VALUE] {
        assert!(
            !stdout.contains(v) && !stderr.contains(v),
            "the guest or the launcher's output holds a real value: {stdout}\n{stderr}"
        );
    }
    // The origin received the real values.
    let got: Vec<serde_json::Value> = world
        .origin_requests()
        .into_iter()
        .filter(|r| r["path"] == "/echo/vc-vm")
        .collect();
    assert_eq!(got.len(), 1, "origin log: {got:?}");
    let header = |name: &str| -> Option<String> {
        got[0]["headers"]
            .as_array()?
            .iter()
            .find(|h| h[0] == name)
            .and_then(|h| h[1].as_str())
            .map(str::to_owned)
    };
    assert_eq!(
        header("authorization").as_deref(),
        Some(format!("Bearer {VC_TOK_VALUE}").as_str())
    );
    assert_eq!(header("x-api-key").as_deref(), Some(VC_KEY_VALUE));
    // The audit's http record, with both secrets by name only.
    let records = audit_records(&audit);
    let http = records
        .iter()
        .find(|r| r["kind"] == "http" && r["path"] == "/echo/vc-vm")
        .unwrap_or_else(|| panic!("no http record: {records:#?}"));
    assert_eq!(http["decision"], "allow", "{http}");
    assert_eq!(http["status"], 200, "{http}");
    assert_eq!(http["sni"], ORIGIN_NAME, "{http}");
    let mut names: Vec<&str> = http["secrets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["location"] == "header")
        .filter_map(|s| s["name"].as_str())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["key", "tok"], "{http}");
    let raw = fs::read_to_string(&audit).unwrap();
    assert!(!raw.contains(VC_TOK_VALUE) && !raw.contains(VC_KEY_VALUE));
    drop(world);
}
