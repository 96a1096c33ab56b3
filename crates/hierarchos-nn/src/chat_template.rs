//! Chat templates rendered as transformers renders them: Jinja2 through `minijinja`, with the environment
//! transformers adds (blocks trimmed, Python string methods, `raise_exception`, `strftime_now`, a `tojson` that
//! writes what Python's `json.dumps` writes, and the `{% generation %}` blocks that mark assistant text).

use std::fmt::Write;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, ErrorKind, Value, syntax::SyntaxConfig};
use serde::Serialize;

/// One turn of a conversation, as chat templates expect it (`role` is `system`, `user` or `assistant`).
#[derive(Clone, Debug, Serialize)]
pub struct ChatMessage {
    /// Who speaks.
    pub role: String,
    /// What is said.
    pub content: String,
}

impl ChatMessage {
    /// A turn of `role` saying `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// The special tokens a tokenizer's config names, which transformers hands a chat template by name: only those
/// set, so that a template's `bos_token is defined` sees what it sees in transformers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpecialTokens {
    /// `(name, text)`: `bos_token`, `eos_token`, `unk_token`, `sep_token`, `pad_token`, `cls_token`,
    /// `mask_token`, and extra named ones.
    pub named: Vec<(String, String)>,
    /// `additional_special_tokens` (transformers 5's `extra_special_tokens`).
    pub additional: Vec<String>,
}

impl SpecialTokens {
    /// The text of the special token called `name` (`bos_token`, ...), if set.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.named.iter().find(|(n, _)| n == name).map(|(_, t)| t.as_str())
    }
}

/// Renders a Hugging Face chat template with the environment transformers uses: blocks trimmed, Python string
/// methods available, `raise_exception` for templates that reject a conversation, and the variables it passes
/// (`messages`, `add_generation_prompt`, `tools` and `documents` as none, the special tokens set).
pub fn render_chat_template(
    template: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    special_tokens: &SpecialTokens,
) -> std::result::Result<String, String> {
    let describe = |e: minijinja::Error| {
        let mut message = format!("chat template: {e}");
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            message.push_str(&format!(": {s}"));
            source = s.source();
        }
        message
    };
    let mut env = Environment::new();
    let syntax = SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .map_err(describe)?;
    env.set_syntax(syntax);
    env.set_unknown_method_callback(python_methods);
    env.add_function(
        "raise_exception",
        |message: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
        },
    );
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    let source = without_generation_tags(template);
    let template = env.template_from_str(&source).map_err(describe)?;
    let mut variables: std::collections::BTreeMap<String, Value> = special_tokens
        .named
        .iter()
        .map(|(name, text)| (name.clone(), Value::from(text.as_str())))
        .collect();
    variables.insert(
        "additional_special_tokens".into(),
        Value::from(special_tokens.additional.clone()),
    );
    variables.insert("messages".into(), Value::from(minijinja::value::Serde(messages)));
    variables.insert("add_generation_prompt".into(), Value::from(add_generation_prompt));
    variables.insert("tools".into(), Value::from(()));
    variables.insert("documents".into(), Value::from(()));
    template.render(Value::from(variables)).map_err(describe)
}

/// Python methods templates call: minijinja-contrib's, and `rsplit`, `removeprefix`, `removesuffix` and `zfill`
/// on strings and `index` on lists, which it lacks; `title` and the argument-less `strip`, `lstrip` and
/// `rstrip` as Python's (minijinja-contrib lowercases after an apostrophe, and keeps Python's whitespace
/// `\x1c`-`\x1f`).
fn python_methods(
    state: &mut minijinja::State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, minijinja::Error> {
    let error = |message: String| minijinja::Error::new(ErrorKind::InvalidOperation, message);
    if let Some(s) = value.as_str() {
        // Python's `str.isspace`: Unicode's white space and the four separators `\x1c`-`\x1f`.
        let space = |c: char| c.is_whitespace() || ('\x1c'..='\x1f').contains(&c);
        match method {
            "strip" | "lstrip" | "rstrip" if args.is_empty() => {
                let kept = match method {
                    "strip" => s.trim_matches(space),
                    "lstrip" => s.trim_start_matches(space),
                    _ => s.trim_end_matches(space),
                };
                return Ok(Value::from(kept));
            }
            "title" => {
                let () = minijinja::value::from_args(args)?;
                // Each cased character after an uncased one goes up, every other one down.
                let mut out = String::with_capacity(s.len());
                let mut after_cased = false;
                for c in s.chars() {
                    if after_cased {
                        out.extend(c.to_lowercase());
                    } else {
                        out.extend(c.to_uppercase());
                    }
                    after_cased = c.is_lowercase() || c.is_uppercase();
                }
                return Ok(Value::from(out));
            }
            "removeprefix" | "removesuffix" => {
                let (affix,): (&str,) = minijinja::value::from_args(args)?;
                let kept = match method {
                    "removeprefix" => s.strip_prefix(affix),
                    _ => s.strip_suffix(affix),
                };
                return Ok(Value::from(kept.unwrap_or(s)));
            }
            "zfill" => {
                let (width,): (usize,) = minijinja::value::from_args(args)?;
                let len = s.chars().count();
                if len >= width {
                    return Ok(Value::from(s));
                }
                let sign = if s.starts_with(['+', '-']) { 1 } else { 0 };
                return Ok(Value::from(format!(
                    "{}{}{}",
                    &s[..sign],
                    "0".repeat(width - len),
                    &s[sign..]
                )));
            }
            "rsplit" => {
                let (sep, maxsplit): (Option<&str>, Option<i64>) = minijinja::value::from_args(args)?;
                let limit = maxsplit.filter(|&m| m >= 0).map(|m| m as usize);
                let mut parts: Vec<&str> = Vec::new();
                match sep {
                    Some("") => return Err(error("rsplit: empty separator".into())),
                    Some(sep) => {
                        let mut rest = s;
                        while limit.is_none_or(|l| parts.len() < l)
                            && let Some(at) = rest.rfind(sep)
                        {
                            parts.push(&rest[at + sep.len()..]);
                            rest = &rest[..at];
                        }
                        parts.push(rest);
                    }
                    None => {
                        let mut rest = s.trim_end();
                        while !rest.is_empty() && limit.is_none_or(|l| parts.len() < l) {
                            match rest.rfind(char::is_whitespace) {
                                Some(at) => {
                                    let width = rest[at..].chars().next().map_or(1, char::len_utf8);
                                    parts.push(&rest[at + width..]);
                                    rest = rest[..at].trim_end();
                                }
                                None => break,
                            }
                        }
                        if !rest.is_empty() {
                            parts.push(rest);
                        }
                    }
                }
                return Ok(Value::from_iter(parts.into_iter().rev().map(Value::from)));
            }
            _ => {}
        }
    }
    if value.kind() == ValueKind::Seq && method == "index" {
        let (wanted,): (Value,) = minijinja::value::from_args(args)?;
        return match value.try_iter()?.position(|item| item == wanted) {
            Some(at) => Ok(Value::from(at)),
            None => Err(error(format!("index: {wanted} is not in the list"))),
        };
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// transformers' `strftime_now(format)`: the current time through `strftime` (here in UTC, where Python takes
/// the local time zone; Llama 3's templates print the date with it).
fn strftime_now(format: String) -> Result<String, minijinja::Error> {
    let now = web_time::SystemTime::now()
        .duration_since(web_time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let time = chrono::DateTime::from_timestamp(now as i64, 0).unwrap_or_default();
    let mut out = String::new();
    write!(out, "{}", time.format(&format)).map_err(|_| {
        minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: bad format {format:?}"),
        )
    })?;
    Ok(out)
}

/// The `{% generation %}` ... `{% endgeneration %}` blocks of transformers' templates (which mark the assistant's
/// text for training masks) as blocks that only render their body, whitespace control kept: minijinja has no
/// custom tags.
fn without_generation_tags(template: &str) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        let Some(end) = tag.find("%}") else {
            break;
        };
        let inner = &tag[2..end];
        let body = inner.trim_start_matches('-').trim_end_matches('-').trim();
        let replacement = match body {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => {
                let open = if inner.starts_with('-') { "{%-" } else { "{%" };
                let close = if inner.ends_with('-') { "-%}" } else { "%}" };
                let _ = write!(out, "{open} {r} {close}");
            }
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// transformers' `tojson` filter: Python's `json.dumps(value, ensure_ascii=False, indent=indent, ...)`, whose
/// separators (`", "`, `": "`) and unescaped text differ from minijinja's own filter (compact, HTML characters
/// escaped), so that tool definitions render as the model saw them in training. Takes `json.dumps`' `indent`,
/// `separators`, `sort_keys` and `ensure_ascii`, as templates pass them.
fn tojson(value: Value, kwargs: Kwargs) -> Result<String, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let options = JsonOptions {
        indent,
        item_separator: match &separators {
            Some(s) if s.len() == 2 => s[0].clone(),
            Some(_) => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be (item_separator, key_separator)",
                ));
            }
            None if indent.is_some() => ",".into(),
            None => ", ".into(),
        },
        key_separator: separators.as_ref().map_or_else(|| ": ".into(), |s| s[1].clone()),
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    python_json(&value, &options, 0, &mut out)?;
    Ok(out)
}

/// `json.dumps`' layout settings.
struct JsonOptions {
    indent: Option<usize>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

fn python_json(value: &Value, options: &JsonOptions, level: usize, out: &mut String) -> Result<(), minijinja::Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => match value.as_i64() {
            Some(i) if !is_float(value) => {
                let _ = write!(out, "{i}");
            }
            _ => out.push_str(&python_float(f64::try_from(value.clone())?)),
        },
        ValueKind::String => json_string(value.as_str().unwrap_or_default(), options.ensure_ascii, out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            json_container(out, ['[', ']'], items.len(), options, level, |i, out| {
                python_json(&items[i], options, level + 1, out)
            })?;
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            let text = |k: &Value| k.as_str().map_or_else(|| k.to_string(), str::to_string);
            if options.sort_keys {
                keys.sort_by_key(|k| text(k));
            }
            json_container(out, ['{', '}'], keys.len(), options, level, |i, out| {
                json_string(&text(&keys[i]), options.ensure_ascii, out);
                out.push_str(&options.key_separator);
                python_json(&value.get_item(&keys[i])?, options, level + 1, out)
            })?;
        }
        _ => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: {} is not JSON", value.kind()),
            ));
        }
    }
    Ok(())
}

/// A list or an object as `json.dumps` lays it out: `item(i, out)` writes element `i`; between them the item
/// separator, and with an indent a new line indented one level deeper than the brackets'.
fn json_container(
    out: &mut String,
    [open, close]: [char; 2],
    count: usize,
    options: &JsonOptions,
    level: usize,
    mut item: impl FnMut(usize, &mut String) -> Result<(), minijinja::Error>,
) -> Result<(), minijinja::Error> {
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = options.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * level));
        }
    };
    out.push(open);
    for i in 0..count {
        if i > 0 {
            out.push_str(&options.item_separator);
        }
        newline(out, level + 1);
        item(i, out)?;
    }
    if count > 0 {
        newline(out, level);
    }
    out.push(close);
    Ok(())
}

/// Whether a number value holds a float (Python writes `1.0`, not `1`, for those).
fn is_float(value: &Value) -> bool {
    value.as_i64().is_none() || value.to_string().contains(['.', 'e', 'E', 'i', 'N'])
}

/// A string as `json.dumps` writes it: with `ensure_ascii=False` as serde_json writes one (quotes, backslashes
/// and control characters escaped, `\n`, `\u001f`, everything else as it is); with `ensure_ascii` every
/// character past ASCII as `\uXXXX` too (a surrogate pair past the first plane).
fn json_string(s: &str, ensure_ascii: bool, out: &mut String) {
    let escaped = serde_json::Value::from(s).to_string();
    if !ensure_ascii {
        out.push_str(&escaped);
        return;
    }
    for c in escaped.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        }
    }
}

/// A float as Python's `repr` writes it: the shortest digits that read back, positional for exponents from -4 to
/// 15 (with `.0` when whole), else `1e-05` / `1.5e+16`; `NaN` and `Infinity` as `json.dumps` allows them.
fn python_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // Rust's `{:e}` writes the shortest round-trip digits too: `d[.ddd]e<exp>`.
    let sci = format!("{v:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let mut out = String::from(if negative { "-" } else { "" });
    if (-4..16).contains(&exp) {
        let point = exp + 1;
        if point <= 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-point) as usize));
            out.push_str(&digits);
        } else if point as usize >= digits.len() {
            out.push_str(&digits);
            out.extend(std::iter::repeat_n('0', point as usize - digits.len()));
            out.push_str(".0");
        } else {
            out.push_str(&digits[..point as usize]);
            out.push('.');
            out.push_str(&digits[point as usize..]);
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_read_as_python_writes_them() {
        for (v, want) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (123456789012345.6, "123456789012345.6"),
            (1.5e300, "1.5e+300"),
            (0.0, "0.0"),
        ] {
            assert_eq!(python_float(v), want, "{v}");
        }
    }

    #[test]
    fn generation_tags_render_their_body() {
        assert_eq!(
            without_generation_tags("a{%- generation -%} b {% endgeneration %}c{{ x }}{% if y %}{% endif %}"),
            "a{%- if true -%} b {% endif %}c{{ x }}{% if y %}{% endif %}"
        );
    }
}
