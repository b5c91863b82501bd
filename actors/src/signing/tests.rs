use super::*;

fn key(id: &str, byte: u8) -> SigningKey {
    SigningKey::new(id, &[byte; 32]).unwrap()
}

fn signed(ring: &Keyring, key: &str, value: &str) -> Record {
    let mut record = Record {
        topic: "transfers.analyzed".into(),
        key: Some(key.as_bytes().to_vec()),
        payload: Some(value.as_bytes().to_vec()),
        headers: vec![
            (headers::EVENT_ID.into(), Some(b"e-1".to_vec())),
            (headers::EVENT_TYPE.into(), Some(b"TransferAnalyzed".to_vec())),
        ],
        ..Record::default()
    };
    let fields = Fields {
        key: Some(key.as_bytes()),
        value: Some(value.as_bytes()),
        event_id: Some(b"e-1"),
        event_type: Some(b"TransferAnalyzed"),
    };
    record.headers.push((SIGNATURE_KEY.into(), Some(ring.signing_id().as_bytes().to_vec())));
    record.headers.push((SIGNATURE.into(), Some(ring.signature(&fields).into_bytes())));
    record
}

#[test]
fn a_signed_record_verifies_and_any_change_breaks_it() {
    let ring = Keyring::single(key("k1", 1));
    let record = signed(&ring, "A", "{}");
    assert_eq!(ring.verify(&record), Ok(()));
    let mut changed = record.clone();
    changed.payload = Some(b"{ }".to_vec());
    assert!(ring.verify(&changed).unwrap_err().contains("does not match"));
    let mut changed = record.clone();
    changed.key = Some(b"B".to_vec());
    assert!(ring.verify(&changed).is_err(), "the key is signed");
    let mut changed = record.clone();
    changed.headers[1].1 = Some(b"TransferSettled".to_vec());
    assert!(ring.verify(&changed).is_err(), "the event type is signed");
    let mut changed = record.clone();
    changed.headers[0].1 = Some(b"e-2".to_vec());
    assert!(ring.verify(&changed).is_err(), "the event id is signed");
    // Transport headers are not.
    let mut moved = record.clone();
    moved.headers.push(("traceparent".into(), Some(b"x".to_vec())));
    moved.headers.push(("retry-attempts".into(), Some(b"2".to_vec())));
    moved.headers.push(("dlt-original-topic".into(), Some(b"t".to_vec())));
    assert_eq!(ring.verify(&moved), Ok(()));
}

#[test]
fn fields_cannot_slide_into_each_other() {
    let ring = Keyring::single(key("k1", 1));
    let record = signed(&ring, "AB", "C");
    let mut slid = record.clone();
    slid.key = Some(b"A".to_vec());
    slid.payload = Some(b"BC".to_vec());
    assert!(ring.verify(&slid).is_err());
    let mut absent = record;
    absent.key = None;
    absent.payload = Some(b"ABC".to_vec());
    assert!(ring.verify(&absent).is_err());
}

#[test]
fn unsigned_unknown_and_malformed_signatures_are_refused() {
    let ring = Keyring::single(key("k1", 1));
    let mut unsigned = signed(&ring, "A", "{}");
    unsigned.headers.truncate(2);
    assert_eq!(ring.verify(&unsigned), Err("unsigned".into()));
    let other = Keyring::single(key("k2", 2));
    assert!(ring.verify(&signed(&other, "A", "{}")).unwrap_err().contains("unknown key `k2`"));
    let same_id_other_secret = Keyring::single(key("k1", 3));
    assert!(ring.verify(&signed(&same_id_other_secret, "A", "{}")).unwrap_err().contains("does not match"));
    let mut half = signed(&ring, "A", "{}");
    half.headers.pop();
    assert!(ring.verify(&half).unwrap_err().contains("needs both"));
    let mut garbled = signed(&ring, "A", "{}");
    garbled.headers[3].1 = Some(b"v1=zz".to_vec());
    assert!(ring.verify(&garbled).unwrap_err().contains("hexadecimal"));
    let mut twice = signed(&ring, "A", "{}");
    twice.headers.push((headers::EVENT_ID.into(), Some(b"e-9".to_vec())));
    assert!(ring.verify(&twice).unwrap_err().contains("more than one `event-id`"));
    let mut record = signed(&other, "A", "{}");
    ring.check(&mut record);
    assert!(record.defect.as_deref().is_some_and(|d| d.starts_with("bad signature: ")), "{:?}", record.defect);
}

#[test]
fn a_rotation_accepts_old_and_new_and_signs_with_one() {
    let (old, new) = (key("2026-11", 1), key("2026-12", 2));
    let before = Keyring::single(old.clone());
    let during = Keyring::new(vec![old.clone(), new.clone()], "2026-12", false).unwrap();
    let after = Keyring::single(new);
    let old_record = signed(&before, "A", "{}");
    let new_record = signed(&during, "A", "{}");
    assert_eq!(during.verify(&old_record), Ok(()), "records signed before the rotation still pass");
    assert_eq!(during.verify(&new_record), Ok(()));
    assert_eq!(after.verify(&new_record), Ok(()));
    assert!(after.verify(&old_record).is_err(), "the retired key is refused");
    assert_eq!(during.signing_id(), "2026-12");
    assert_eq!(
        Keyring::new(vec![old.clone(), old.clone()], "2026-11", false).unwrap_err(),
        KeyError::Duplicate("2026-11".into())
    );
    assert_eq!(Keyring::new(vec![old], "x", false).unwrap_err(), KeyError::Unknown("x".into()));
}

#[test]
fn unsigned_records_pass_only_when_asked_and_bad_ones_never() {
    let k = key("k1", 1);
    let lenient = Keyring::new(vec![k.clone()], "k1", true).unwrap();
    let mut unsigned = signed(&lenient, "A", "{}");
    unsigned.headers.truncate(2);
    assert_eq!(lenient.verify(&unsigned), Ok(()));
    let forged = signed(&Keyring::single(key("k1", 9)), "A", "{}");
    assert!(lenient.verify(&forged).is_err());
}

#[test]
fn keys_are_checked_and_never_print() {
    assert!(matches!(SigningKey::new("k1", &[0; 31]), Err(KeyError::TooShort { .. })));
    assert!(matches!(SigningKey::new("k 1", &[0; 32]), Err(KeyError::BadId(_))));
    assert!(matches!(SigningKey::new("", &[0; 32]), Err(KeyError::BadId(_))));
    let k = SigningKey::random("r").unwrap();
    assert_ne!(k.secret(), SigningKey::random("r").unwrap().secret());
    // Text that a key file holds as it is: never a trailing newline to lose.
    for _ in 0..1_000 {
        let secret = SigningKey::random("r").unwrap().secret().to_vec();
        assert!(secret.len() == 64 && secret.iter().all(u8::is_ascii_hexdigit), "{secret:?}");
    }
    let shown = format!("{k:?} {:?}", Keyring::single(k.clone()));
    assert!(!shown.contains(&format!("{:?}", k.secret())) && shown.contains("<redacted>"), "{shown}");
}
