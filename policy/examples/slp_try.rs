//! scratch
fn main() {
    for f in std::env::args().skip(1) {
        match sluice_policy::load_file(std::path::Path::new(&f), &Default::default()) {
            Ok(p) => println!("ok {}", p.version_hash()),
            Err(e) => println!("{e}"),
        }
    }
}
