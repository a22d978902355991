//! Turns the shipped profiles (TOML, the source of truth that `profile show` prints and
//! whose SHA-256 reports name) into JSON at build time: parsing TOML was a fifth of what a
//! one-shot `run` did before the clone, and JSON of the same shape decodes into the same
//! types an order of magnitude faster.

use std::path::Path;

const PROFILES: [&str; 5] = ["default", "strict", "compat", "floor", "floor-allowlist"];

fn main() {
    let out = std::env::var("OUT_DIR").unwrap_or_else(|_| ".".into());
    for name in PROFILES {
        let src = format!("profiles/{name}.toml");
        println!("cargo:rerun-if-changed={src}");
        let text = match std::fs::read_to_string(&src) {
            Ok(t) => t,
            Err(e) => {
                println!("cargo:warning={src}: {e}");
                std::process::exit(1);
            }
        };
        let value: toml::Value = match toml::from_str(&text) {
            Ok(v) => v,
            Err(e) => {
                println!("cargo:warning={src}: {e}");
                std::process::exit(1);
            }
        };
        let json = match serde_json::to_string(&value) {
            Ok(j) => j,
            Err(e) => {
                println!("cargo:warning={src}: {e}");
                std::process::exit(1);
            }
        };
        if let Err(e) = std::fs::write(Path::new(&out).join(format!("{name}.json")), json) {
            println!("cargo:warning={name}.json: {e}");
            std::process::exit(1);
        }
    }
}
