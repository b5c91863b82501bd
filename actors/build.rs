//! The migrations are embedded into this crate (`store::migrate`); rebuild it when they
//! change, which `embed_migrations!` cannot tell cargo by itself.

fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
