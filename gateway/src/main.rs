//! `sluice-gateway` binary: wiring only; the logic lives in the library.

fn main() {
    eprintln!("sluice-gateway: not implemented yet");
    std::process::exit(2);
}
