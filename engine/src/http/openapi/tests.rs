use std::collections::BTreeSet;
use std::path::Path;

use super::*;

/// Every `(METHOD, path)` the sources under `src/http/` register with
/// `.route("<path>", web::<method>()...)`, by reading them: actix keeps no list to ask.
fn registered_routes() -> BTreeSet<(String, String)> {
    let needle = format!(".{}(\"", "route");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/http");
    let mut files = vec![dir];
    let mut routes = BTreeSet::new();
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") || path.ends_with("openapi/tests.rs") {
            continue;
        }
        let text: String = std::fs::read_to_string(&path).unwrap().split_whitespace().collect();
        for other in ["web::resource(", "web::scope(", "#[get(", "#[post(", "#[route("] {
            assert!(
                !text.contains(other),
                "{} registers a route with {other}: register it as .route(path, web::method()...) so this test sees it",
                path.display()
            );
        }
        for (at, _) in text.match_indices(&needle) {
            let rest = &text[at + needle.len()..];
            let (route, rest) = rest.split_once('"').unwrap();
            let method = rest.strip_prefix(",web::").and_then(|r| r.split_once('(')).map(|(m, _)| m).unwrap_or("");
            assert!(!method.is_empty(), "{}: cannot read the method of {route}", path.display());
            routes.insert((method.to_uppercase(), route.to_owned()));
        }
    }
    routes
}

fn documented(doc: &Value) -> BTreeSet<(String, String)> {
    let paths = doc["paths"].as_object().unwrap();
    paths
        .iter()
        .flat_map(|(path, item)| {
            item.as_object().unwrap().keys().map(move |method| (method.to_uppercase(), path.clone()))
        })
        .collect()
}

#[test]
fn every_registered_route_is_documented_and_every_documented_one_registered() {
    let registered = registered_routes();
    assert!(registered.len() > 20, "found only {registered:?}");
    let mut docs = documented(&intake_doc(1_000, false));
    docs.extend(documented(&admin_doc()));
    let undocumented: Vec<_> = registered.difference(&docs).collect();
    assert!(
        undocumented.is_empty(),
        "routes without an #[utoipa::path] in engine/src/http/openapi.rs: {undocumented:?}"
    );
    let unregistered: Vec<_> = docs.difference(&registered).collect();
    assert!(unregistered.is_empty(), "documented but not registered: {unregistered:?}");
}

#[test]
fn the_documents_are_openapi_3_1_and_every_error_is_an_error_body() {
    for doc in [intake_doc(1_000, false), admin_doc()] {
        assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"), "{}", doc["openapi"]);
        assert!(doc["components"]["schemas"]["ErrorBody"].is_object(), "ErrorBody is a schema");
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                for (status, response) in op["responses"].as_object().unwrap() {
                    // Answers of their own: "not ready" with its reasons, the broken invariants.
                    let own = [("/readyz", "503"), ("/admin/ledger/check", "409")]
                        .contains(&(path.as_str(), status.as_str()));
                    if (status.starts_with('4') || status.starts_with('5')) && !own {
                        let schema = &response["content"]["application/json"]["schema"]["$ref"];
                        assert_eq!(schema, "#/components/schemas/ErrorBody", "{method} {path} {status}");
                    }
                }
            }
        }
    }
}

#[test]
fn the_served_intake_document_follows_the_configuration() {
    let open = intake_doc(777, false);
    let amount = &open["components"]["schemas"]["CreateTransferBody"]["properties"]["amountCents"];
    assert_eq!((amount["minimum"].as_i64(), amount["maximum"].as_i64()), (Some(1), Some(777)), "{amount}");
    assert_eq!(open["paths"]["/transfers"]["post"]["security"], json!([{}, {"client": []}]));
    let closed = intake_doc(777, true);
    assert_eq!(closed["paths"]["/transfers"]["post"]["security"], json!([{"client": []}]));
    assert_eq!(closed["paths"]["/openapi.json"]["get"]["security"], json!([{}]), "the document stays open");
    let admin = admin_doc();
    assert_eq!(admin["paths"]["/admin/token"]["get"]["security"], json!([{"admin": []}]));
    assert!(admin["paths"]["/admin/token"]["get"]["responses"]["403"].is_object());
    assert!(admin["paths"]["/healthz"]["get"].get("security").is_none(), "open");
}

#[test]
fn a_path_fits_a_template_as_actix_matches_it() {
    assert!(fits("/transfers/{id}", "/transfers/abc"));
    assert!(!fits("/transfers/{id}", "/transfers/"), "an empty segment");
    assert!(!fits("/transfers/{id}", "/transfers/a/b"));
    assert!(!fits("/transfers", "/transfers/"), "a trailing slash");
    assert!(fits("/admin/dlt/{topic}/replay", "/admin/dlt/x-dlt/replay"));
    let ops = operations(&admin_doc());
    let allowed: Vec<&str> =
        ops.iter().filter(|(_, t)| fits(t, "/admin/dlt/dead_letters")).map(|(m, _)| m.as_str()).collect();
    assert_eq!(allowed, ["GET", "GET"], "the table's route and the topic's both take GET only");
}
