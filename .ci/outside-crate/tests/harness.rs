use outside_user::{registry, Pay};
use palisade::testing::{assert_enqueued, Harness};
use palisade::NewJob;
use serde_json::json;

#[test]
fn a_payment_is_applied_once_and_asks_for_a_receipt() {
    let h = Harness::new(registry()).with_sink("ledger");
    let pay = NewJob::new("pay", &Pay { account: 7, cents: 250 }).unwrap();
    assert!(h.perform(pay.clone()).unwrap().completed());
    assert_enqueued!(h, kind = "receipt", queue = "mail", payload = json!(7));
    assert_eq!(h.drain("mail").unwrap().completed(), 1);
    let ledger = h.sink("ledger").unwrap();
    assert_eq!(ledger.field("account:7", "cents").as_deref(), Some("250"));
    h.zombie(pay).unwrap().assert_fenced();
}
