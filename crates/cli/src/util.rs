//! Printing helpers of the command.

pub use graphopt::util::human_bytes;

/// Writes to stdout; a closed pipe (`graphopt inspect m.onnx | head`) is not
/// an error and not a panic.
pub fn print_out(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// Pretty JSON with a final newline.
pub fn json_text<T: serde::Serialize + ?Sized>(v: &T) -> graphopt::Result<String> {
    let mut s = serde_json::to_string_pretty(v)
        .map_err(|e| graphopt::Error::new(format!("cannot write JSON: {e}")))?;
    s.push('\n');
    Ok(s)
}
