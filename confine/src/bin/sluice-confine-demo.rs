//! Demo for the tests of `gateway_self_restrict`: opens nothing, restricts
//! itself as the gateway would, then tries what its arguments say and prints
//! one line per attempt. Usage:
//! `sluice-confine-demo AUDIT_FILE OTHER_FILE [exec]`.

use std::io::Write;
use std::path::PathBuf;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(audit), Some(other)) = (args.first(), args.get(1)) else {
        eprintln!("usage: sluice-confine-demo AUDIT_FILE OTHER_FILE [exec]");
        std::process::exit(2);
    };
    let conf = sluice_confine::GatewayConfinement {
        audit_path: Some(PathBuf::from(audit)),
        ..Default::default()
    };
    match sluice_confine::gateway_self_restrict(&conf) {
        Ok(r) => println!("restricted: {r:?}"),
        Err(e) => {
            println!("restrict failed: {e}");
            std::process::exit(1);
        }
    }
    let audit_write = std::fs::OpenOptions::new()
        .append(true)
        .open(audit)
        .and_then(|mut f| f.write_all(b"{\"ok\":true}\n"));
    println!("audit write: {}", outcome(&audit_write));
    let other_write = std::fs::write(other, b"x");
    println!("other write: {}", outcome(&other_write));
    let read = std::fs::read_to_string("/etc/hostname");
    println!("other read: {}", outcome(&read));
    if args.get(2).is_some_and(|a| a == "exec") {
        let _ = std::io::stdout().flush();
        let spawned = std::process::Command::new("/bin/true").status();
        println!("exec: {}", outcome(&spawned));
    }
}

fn outcome<T>(r: &std::io::Result<T>) -> String {
    match r {
        Ok(_) => "ok".to_owned(),
        Err(e) => format!("denied ({e})"),
    }
}
