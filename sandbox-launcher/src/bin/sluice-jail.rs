//! `sluice-jail`: the jail helper as a binary of its own (tests, and
//! launchers that prefer not to re-execute `sluice`). Run only by
//! `sluice_launcher::jail::spawn` as `sluice-jail __jail-exec`.

fn main() {
    sluice_launcher::jail::helper_main_if_requested();
    eprintln!("sluice-jail: internal helper of `sluice`; started by the launcher, not by hand");
    std::process::exit(2);
}
