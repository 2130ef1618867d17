use super::*;

fn failed() -> FloorError {
    FloorError::NftFailed {
        what: WHAT,
        stderr: "interrupted".to_owned(),
    }
}

/// Only names nft reads as the one interface they are: no wildcard
/// (`tap*`), nothing nft's grammar or a listing gives a meaning.
#[test]
fn interface_names_outside_a_safe_set_are_refused_in_one_line() {
    for ok in [
        "tap0",
        "eth0.100",
        "veth-a_b",
        "a@b",
        "x",
        "abcdefghijklmno",
    ] {
        assert!(check_iface(ok).is_ok(), "{ok}");
    }
    for bad in [
        "",
        ".",
        "..",
        "abcdefghijklmnop",
        "tap*",
        "a}",
        "a{",
        "a;b",
        "a,b",
        "a#b",
        "a\\b",
        "a\"b",
        "a b",
        "a/b",
        "a:b",
        "a\nb",
        "t\u{e4}p",
    ] {
        let e = check_iface(bad).unwrap_err();
        assert!(matches!(e, FloorError::Invalid(_)), "{bad}: {e}");
        let line = e.to_string();
        assert!(
            !line.contains('\n') && line.contains("not an interface name"),
            "{line}"
        );
    }
}

#[test]
fn only_names_of_an_instances_making_are_instance_names() {
    assert!(instance_name(&instance_table("tap0")));
    assert!(instance_name(&instance_table("a.b-c")));
    for other in [
        "sluice_floor_tap0_1f_",
        "sluice_floor_tap0_1f_2g",
        "sluice_floor_tap0_1_2 x",
        "sluice_floor__1_2",
        "sluice_floor_1_2",
        "sluice_floor_ta;p_1_2",
        "other_tap0_1_2",
    ] {
        assert!(!instance_name(other), "{other}");
    }
}

/// Setting the link down and putting the floor back are both done
/// and both reported: a failed cut never hides the floor's outcome.
#[test]
fn the_cut_and_the_floor_are_both_reported() {
    assert!(both("tap0", Ok(()), Ok(())).is_ok());
    let floor_only = both("tap0", Ok(()), Err(failed())).unwrap_err();
    assert!(
        matches!(floor_only, FloorError::NftFailed { .. }),
        "{floor_only}"
    );
    let cut_only = both("tap0", Err("EBUSY".to_owned()), Ok(())).unwrap_err();
    assert_eq!(
        cut_only.to_string(),
        "cannot set `tap0` down (EBUSY); its floor is back on it"
    );
    let neither = both("tap0", Err("EBUSY".to_owned()), Err(failed())).unwrap_err();
    let line = neither.to_string();
    assert!(
        line.starts_with(
            "cannot set `tap0` down (EBUSY); putting its floor back failed too: nft refused"
        ) && !line.contains('\n'),
        "{line}"
    );
}

/// A failure that may pass is asked again; a floor that no longer
/// holds is the answer at once.
#[test]
fn transient_failures_are_retried_and_tampering_is_not() {
    let pause = std::time::Duration::ZERO;
    let mut calls = 0;
    let twice_then_ok = settle(3, pause, || {
        calls += 1;
        if calls < 3 { Err(failed()) } else { Ok(()) }
    });
    assert!(twice_then_ok.is_ok());
    assert_eq!(calls, 3);
    calls = 0;
    let always = settle(3, pause, || {
        calls += 1;
        Err(failed())
    });
    assert!(matches!(always, Err(FloorError::NftFailed { .. })));
    assert_eq!(calls, 3);
    calls = 0;
    let tampered = settle(3, pause, || {
        calls += 1;
        Err(FloorError::Verify {
            what: WHAT,
            detail: "gone".to_owned(),
        })
    });
    assert!(matches!(tampered, Err(FloorError::Verify { .. })));
    assert_eq!(calls, 1);
}
