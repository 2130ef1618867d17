//! `sluice` binary: wiring only.

fn main() {
    eprintln!("sluice: not implemented yet");
    std::process::exit(2);
}
