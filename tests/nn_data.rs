//! Training data: .txt, .jsonl and .parquet sources, folders and Hub datasets (from a tiny Hub-like server on
//! 127.0.0.1) become token sequences; errors name the file and row; the eval split, the batch order and its
//! resumption, and padded batches.

mod common;
use common::hub::{Commits, HubServer, Repo};
use common::tmpdir;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hierarchos::nn::hub::HubOptions;
use hierarchos::nn::train::data::{Batch, Batcher, BatcherState, IGNORE_INDEX, TokenData, make_batch};
use hierarchos::nn::{Error, Tokenizer};
use parquet::basic::{Compression, GzipLevel, ZstdLevel};
use parquet::data_type::{ByteArray, ByteArrayType, Int32Type, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

fn tokenizer() -> Tokenizer {
    Tokenizer::from_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama")).unwrap()
}

const DOCS: [&str; 4] = [
    "Alice was beginning to get very tired of sitting by her sister on the bank,",
    "and of having nothing to do: once or twice she had peeped into the book her sister was reading,",
    "but it had no pictures or conversations in it,",
    "'and what is the use of a book,' thought Alice 'without pictures or conversations?'",
];

/// The documents tokenized one by one with special tokens, concatenated and cut into `seq_len` chunks.
fn packed(tok: &Tokenizer, docs: &[&str], seq_len: usize) -> (Vec<Vec<u32>>, usize) {
    let all: Vec<u32> = docs.iter().flat_map(|d| tok.encode(d, true).unwrap()).collect();
    (all.chunks_exact(seq_len).map(<[u32]>::to_vec).collect(), all.len())
}

fn load(path: &Path, tok: Option<&Tokenizer>, seq_len: usize) -> hierarchos::nn::Result<TokenData> {
    TokenData::load(path.to_str().unwrap(), tok, seq_len)
}

/// The message of a load that must fail.
fn load_err(path: &Path, tok: Option<&Tokenizer>, seq_len: usize) -> String {
    match load(path, tok, seq_len) {
        Ok(d) => panic!(
            "{}: loaded {} sequences, expected an error",
            path.display(),
            d.sequences.len()
        ),
        Err(e) => e.to_string(),
    }
}

fn assert_has(msg: &str, parts: &[&str]) {
    for part in parts {
        assert!(msg.contains(part), "`{msg}` lacks `{part}`");
    }
}

/// One column of a parquet test file.
enum Column<'a> {
    /// `required binary name (UTF8)`.
    Text(&'a str, Vec<&'a str>),
    /// `required int32 name`.
    Int(&'a str, Vec<i32>),
    /// A pyarrow-style `list<int32>` or `list<int64>` (`wide`) with nullable elements.
    Ids(&'a str, bool, Vec<Vec<Option<i64>>>),
}

fn write_parquet(path: &Path, compression: Compression, columns: &[Column]) {
    let fields: Vec<String> = columns
        .iter()
        .map(|c| match c {
            Column::Text(name, _) => format!("required binary {name} (UTF8);"),
            Column::Int(name, _) => format!("required int32 {name};"),
            Column::Ids(name, wide, _) => format!(
                "optional group {name} (LIST) {{ repeated group list {{ optional {} element; }} }}",
                if *wide { "int64" } else { "int32" }
            ),
        })
        .collect();
    let schema = Arc::new(parse_message_type(&format!("message schema {{ {} }}", fields.join(" "))).unwrap());
    let props = Arc::new(WriterProperties::builder().set_compression(compression).build());
    let mut writer = SerializedFileWriter::new(std::fs::File::create(path).unwrap(), schema, props).unwrap();
    let mut group = writer.next_row_group().unwrap();
    for column in columns {
        let mut out = group.next_column().unwrap().unwrap();
        match column {
            Column::Text(_, rows) => {
                let values: Vec<ByteArray> = rows.iter().map(|s| ByteArray::from(*s)).collect();
                out.typed::<ByteArrayType>().write_batch(&values, None, None).unwrap();
            }
            Column::Int(_, rows) => {
                out.typed::<Int32Type>().write_batch(rows, None, None).unwrap();
            }
            Column::Ids(_, wide, rows) => {
                let (mut values, mut def, mut rep) = (Vec::new(), Vec::new(), Vec::new());
                for row in rows {
                    if row.is_empty() {
                        def.push(1);
                        rep.push(0);
                    }
                    for (k, v) in row.iter().enumerate() {
                        rep.push(if k == 0 { 0 } else { 1 });
                        def.push(if v.is_some() { 3 } else { 2 });
                        values.extend(*v);
                    }
                }
                if *wide {
                    out.typed::<Int64Type>()
                        .write_batch(&values, Some(&def), Some(&rep))
                        .unwrap();
                } else {
                    let values: Vec<i32> = values.iter().map(|&v| v as i32).collect();
                    out.typed::<Int32Type>()
                        .write_batch(&values, Some(&def), Some(&rep))
                        .unwrap();
                }
            }
        }
        out.close().unwrap();
    }
    group.close().unwrap();
    writer.close().unwrap();
}

fn some(rows: &[&[i64]]) -> Vec<Vec<Option<i64>>> {
    rows.iter().map(|r| r.iter().map(|&v| Some(v)).collect()).collect()
}

fn u32_rows(rows: &[&[i64]]) -> Vec<Vec<u32>> {
    rows.iter().map(|r| r.iter().map(|&v| v as u32).collect()).collect()
}

#[test]
fn txt_is_tokenized_per_line_and_packed() {
    let tok = tokenizer();
    let dir = tmpdir("data-txt");
    let path = dir.join("alice.txt");
    std::fs::write(
        &path,
        format!("{}\n\n{}\r\n   \n{}\n{}", DOCS[0], DOCS[1], DOCS[2], DOCS[3]),
    )
    .unwrap();
    let seq_len = 16;
    // Lines keep their line breaks, blank lines included (transformers' run_clm keep_linebreaks).
    let lines = [
        format!("{}\n", DOCS[0]),
        "\n".to_string(),
        format!("{}\r\n", DOCS[1]),
        "   \n".to_string(),
        format!("{}\n", DOCS[2]),
        DOCS[3].to_string(),
    ];
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let (want, total) = packed(&tok, &lines, seq_len);
    assert!(
        total % seq_len != 0 && want.len() >= 3,
        "the fixture should leave a remainder: {total}"
    );
    let data = load(&path, Some(&tok), seq_len).unwrap();
    assert_eq!(data.sequences, want);
    assert!(data.packed);
    assert_eq!(data.files, vec![path.clone()]);
    // Each document starts with the tokenizer's BOS, so the first chunk does.
    assert_eq!(data.sequences[0][0], tok.token_to_id("<s>").unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn jsonl_text_rows_and_input_ids_rows() {
    let tok = tokenizer();
    let dir = tmpdir("data-jsonl");
    let text = dir.join("text.jsonl");
    let lines: Vec<String> = DOCS
        .iter()
        .map(|d| serde_json::json!({"text": d, "meta": 1}).to_string())
        .collect();
    std::fs::write(&text, lines.join("\n\n") + "\n").unwrap();
    let data = load(&text, Some(&tok), 12).unwrap();
    assert_eq!(data.sequences, packed(&tok, &DOCS, 12).0);
    assert!(data.packed);

    // `input_ids` rows are sequences as they are, one each, whatever their length (up to seq_len); no tokenizer.
    let ids = dir.join("ids.jsonl");
    std::fs::write(
        &ids,
        "{\"input_ids\": [5, 6, 7]}\n\n{\"input_ids\": [8, 9], \"text\": \"ignored\"}\n{\"input_ids\": [1, 2, 3, 4]}\n",
    )
    .unwrap();
    let data = load(&ids, None, 4).unwrap();
    assert_eq!(data.sequences, vec![vec![5, 6, 7], vec![8, 9], vec![1, 2, 3, 4]]);
    assert!(!data.packed);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn parquet_text_and_input_ids_columns() {
    let tok = tokenizer();
    let dir = tmpdir("data-parquet");
    let text = dir.join("text.parquet");
    write_parquet(
        &text,
        Compression::SNAPPY,
        &[Column::Int("id", vec![0, 1, 2, 3]), Column::Text("text", DOCS.to_vec())],
    );
    let data = load(&text, Some(&tok), 10).unwrap();
    assert_eq!(data.sequences, packed(&tok, &DOCS, 10).0);
    assert!(data.packed);

    let rows: &[&[i64]] = &[&[3, 1, 4], &[1, 5], &[9, 2, 6, 5, 3]];
    for (i, (compression, wide)) in [
        (Compression::ZSTD(ZstdLevel::default()), false),
        (Compression::GZIP(GzipLevel::default()), true),
        (Compression::UNCOMPRESSED, false),
    ]
    .into_iter()
    .enumerate()
    {
        let path = dir.join(format!("ids{i}.parquet"));
        // `input_ids` wins over `text`, as in .jsonl rows.
        write_parquet(
            &path,
            compression,
            &[
                Column::Text("text", vec!["a", "b", "c"]),
                Column::Ids("input_ids", wide, some(rows)),
            ],
        );
        let data = load(&path, None, 5).unwrap();
        assert_eq!(data.sequences, u32_rows(rows), "{compression:?}");
        assert!(!data.packed);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn folder_reads_its_data_files_in_name_order() {
    let dir = tmpdir("data-folder");
    write_parquet(
        &dir.join("b.parquet"),
        Compression::SNAPPY,
        &[Column::Ids("input_ids", false, some(&[&[20, 21], &[22, 23, 24]]))],
    );
    std::fs::write(dir.join("a.jsonl"), "{\"input_ids\": [10, 11]}\n").unwrap();
    // Shards written out of order, so that the directory's own order is unlikely to be the sorted one.
    for k in [5u32, 2, 7, 0, 3, 6, 1, 4] {
        std::fs::write(dir.join(format!("c-{k}.jsonl")), ids_row(&[30 + k, 30])).unwrap();
    }
    std::fs::write(dir.join("README.md"), "not data").unwrap();
    std::fs::create_dir(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/z.jsonl"), "{\"input_ids\": [99, 99]}\n").unwrap();
    let data = load(&dir, None, 8).unwrap();
    let mut want = vec![vec![10, 11], vec![20, 21], vec![22, 23, 24]];
    want.extend((0..8).map(|k| vec![30 + k, 30]));
    assert_eq!(data.sequences, want);
    let mut files = vec![dir.join("a.jsonl"), dir.join("b.parquet")];
    files.extend((0..8).map(|k| dir.join(format!("c-{k}.jsonl"))));
    assert_eq!(data.files, files);

    // A text file among `input_ids` files is an error naming it.
    std::fs::write(dir.join("d.txt"), "some text\n").unwrap();
    let msg = load_err(&dir, Some(&tokenizer()), 8);
    assert_has(&msg, &["d.txt", "line 1", "a.jsonl"]);

    let empty = tmpdir("data-empty-folder");
    std::fs::write(empty.join("notes.md"), "x").unwrap();
    assert_has(&load_err(&empty, None, 8), &["data-empty-folder", ".parquet"]);
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&empty).unwrap();
}

#[test]
fn malformed_jsonl_names_file_and_line() {
    let tok = tokenizer();
    let dir = tmpdir("data-bad-jsonl");
    let ok = "{\"input_ids\": [1, 2]}";
    let cases: [(&str, String, &[&str]); 14] = [
        ("json", format!("{ok}\n\n{{\"input_ids\": [1, 2\n"), &["line 3", "JSON"]),
        ("object", format!("{ok}\n[1, 2]\n"), &["line 2", "object"]),
        (
            "fields",
            format!("{ok}\n{{\"txt\": \"a\"}}\n"),
            &["line 2", "`text`", "`input_ids`"],
        ),
        (
            "text-type",
            "{\"text\": 5}\n".into(),
            &["line 1", "`text` is not a string"],
        ),
        (
            "ids-type",
            format!("{ok}\n{{\"input_ids\": \"1 2\"}}\n"),
            &["line 2", "not an array"],
        ),
        (
            "negative",
            format!("{ok}\n{{\"input_ids\": [1, -1]}}\n"),
            &["line 2", "`input_ids`[1] is -1"],
        ),
        (
            "float",
            format!("{{\"input_ids\": [1.5, 2]}}\n{ok}\n"),
            &["line 1", "`input_ids`[0] is 1.5"],
        ),
        (
            "huge",
            "{\"input_ids\": [1, 4294967296]}\n".into(),
            &["line 1", "4294967296", "not a token id"],
        ),
        (
            "beyond-i32",
            "{\"input_ids\": [2147483648, 1]}\n".into(),
            &["line 1", "2147483648"],
        ),
        (
            "empty",
            format!("{ok}\n{ok}\n{{\"input_ids\": []}}\n"),
            &["line 3", "length 0"],
        ),
        (
            "single",
            format!("{{\"input_ids\": [7]}}\n{ok}\n"),
            &["line 1", "length 1", "at least 2"],
        ),
        (
            "long",
            format!("{ok}\n{{\"input_ids\": [1, 2, 3, 4, 5]}}\n"),
            &["line 2", "length 5, more than seq_len 4"],
        ),
        (
            "mixed",
            format!("{ok}\n{{\"text\": \"hi\"}}\n"),
            &["line 2", "`text` row", "line 1 has `input_ids`"],
        ),
        (
            "mixed-back",
            format!("{{\"text\": \"hi\"}}\n{ok}\n"),
            &["line 2", "`input_ids` row"],
        ),
    ];
    for (name, content, parts) in cases {
        let path = dir.join(format!("{name}.jsonl"));
        std::fs::write(&path, content).unwrap();
        let msg = load_err(&path, Some(&tok), 4);
        assert_has(&msg, &[&format!("{name}.jsonl")]);
        assert_has(&msg, parts);
    }
    // Text without a tokenizer, in each text format.
    let path = dir.join("notok.jsonl");
    std::fs::write(&path, "{\"text\": \"hello\"}\n").unwrap();
    assert_has(&load_err(&path, None, 4), &["notok.jsonl", "line 1", "tokenizer"]);
    let path = dir.join("notok.txt");
    std::fs::write(&path, "hello\n").unwrap();
    assert_has(&load_err(&path, None, 4), &["notok.txt", "line 1", "tokenizer"]);
    let path = dir.join("latin1.txt");
    std::fs::write(&path, b"fine\nalso fine\ncaf\xe9\n").unwrap();
    assert_has(&load_err(&path, Some(&tok), 4), &["latin1.txt", "line 3", "UTF-8"]);
    // Blank files have no rows.
    let path = dir.join("blank.jsonl");
    std::fs::write(&path, "\n  \n").unwrap();
    assert_has(&load_err(&path, None, 4), &["blank.jsonl", "no rows"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn malformed_parquet_names_file_and_row() {
    let tok = tokenizer();
    let dir = tmpdir("data-bad-parquet");
    let cases: Vec<(&str, Vec<Column>, &[&str])> = vec![
        (
            "columns",
            vec![Column::Int("id", vec![1]), Column::Text("content", vec!["x"])],
            &["no `text` or `input_ids` column", "id, content"],
        ),
        (
            "text-type",
            vec![Column::Int("text", vec![5])],
            &["row 0", "`text` is 5, not a string"],
        ),
        (
            "null",
            vec![Column::Ids(
                "input_ids",
                false,
                vec![vec![Some(1), Some(2)], vec![Some(3), None]],
            )],
            &["row 1", "`input_ids`[1] is null"],
        ),
        (
            "negative",
            vec![Column::Ids("input_ids", true, some(&[&[1, 2], &[3, 4], &[-7, 1]]))],
            &["row 2", "`input_ids`[0] is -7"],
        ),
        (
            "empty",
            vec![Column::Ids("input_ids", false, vec![vec![]])],
            &["row 0", "length 0"],
        ),
        (
            "long",
            vec![Column::Ids("input_ids", false, some(&[&[1, 2], &[1, 2, 3, 4, 5]]))],
            &["row 1", "length 5, more than seq_len 4"],
        ),
    ];
    for (name, columns, parts) in cases {
        let path = dir.join(format!("{name}.parquet"));
        write_parquet(&path, Compression::SNAPPY, &columns);
        let msg = load_err(&path, Some(&tok), 4);
        assert_has(&msg, &[&format!("{name}.parquet")]);
        assert_has(&msg, parts);
    }
    let path = dir.join("junk.parquet");
    std::fs::write(&path, "not parquet at all").unwrap();
    assert_has(
        &load_err(&path, None, 4),
        &["junk.parquet", "not a readable parquet file"],
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn unsupported_files_and_missing_paths() {
    let dir = tmpdir("data-kinds");
    let csv = dir.join("table.csv");
    std::fs::write(&csv, "text\nhello\n").unwrap();
    assert_has(
        &load_err(&csv, None, 4),
        &["table.csv", ".csv", ".parquet, .jsonl, .txt"],
    );
    let bare = dir.join("README");
    std::fs::write(&bare, "x").unwrap();
    assert_has(&load_err(&bare, None, 4), &["README", "no extension"]);
    // A missing path that is no Hub id is reported as a missing path; seq_len below 2 is refused.
    let missing = dir.join("missing.jsonl");
    let msg = load_err(&missing, None, 4);
    assert_has(&msg, &["missing.jsonl", "no such file or folder"]);
    std::fs::write(dir.join("ok.jsonl"), "{\"input_ids\": [1, 2]}\n").unwrap();
    assert_has(&load_err(&dir.join("ok.jsonl"), None, 1), &["seq_len 1"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn seq_len_larger_than_the_text() {
    let tok = tokenizer();
    let dir = tmpdir("data-short");
    let path = dir.join("short.txt");
    let lines = [format!("{}\n", DOCS[0]), format!("{}\n", DOCS[1])];
    std::fs::write(&path, lines.concat()).unwrap();
    let (_, total) = packed(&tok, &[lines[0].as_str(), lines[1].as_str()], 1);
    let msg = load_err(&path, Some(&tok), total + 1);
    assert_has(
        &msg,
        &[
            "short.txt",
            &format!("{total} tokens, fewer than seq_len {}", total + 1),
        ],
    );
    // Exactly one chunk fits.
    assert_eq!(load(&path, Some(&tok), total).unwrap().sequences.len(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn numbered(n: u32) -> TokenData {
    TokenData {
        sequences: (0..n).map(|i| vec![i, i + 100]).collect(),
        packed: true,
        files: vec![PathBuf::from("x.jsonl")],
    }
}

#[test]
fn eval_split_takes_the_last_sequences() {
    let (train, eval) = numbered(10).split_eval(0.25).unwrap();
    assert_eq!(train.sequences, numbered(7).sequences);
    assert_eq!(eval.sequences, numbered(10).sequences[7..]);
    assert!(train.packed && eval.packed && eval.files == train.files);
    let (train, eval) = numbered(10).split_eval(0.0).unwrap();
    assert_eq!((train.sequences.len(), eval.sequences.len()), (10, 0));
    // ceil(0.01 * 10) = 1.
    assert_eq!(numbered(10).split_eval(0.01).unwrap().1.sequences, vec![vec![9, 109]]);
    for (n, fraction) in [(10, 1.0), (10, -0.1), (10, f64::NAN), (10, 0.95), (1, 0.5)] {
        assert!(
            matches!(numbered(n).split_eval(fraction), Err(Error::Invalid(_))),
            "{n} sequences, fraction {fraction}"
        );
    }
}

#[test]
fn batcher_in_order_wraps_across_epochs() {
    let (n, b) = (10, 4);
    let mut batcher = Batcher::new(n, 7, false).unwrap();
    assert_eq!(batcher.next_indices(b), vec![0, 1, 2, 3]);
    assert_eq!(batcher.next_indices(b), vec![4, 5, 6, 7]);
    assert_eq!(batcher.next_indices(b), vec![8, 9, 0, 1]);
    assert_eq!(batcher.state(), BatcherState { epoch: 1, cursor: 2 });
    for k in 3..40 {
        let want: Vec<usize> = (k * b..k * b + b).map(|i| i % n).collect();
        assert_eq!(batcher.next_indices(b), want, "step {k}");
    }
    assert_eq!(batcher.state(), BatcherState { epoch: 16, cursor: 0 });
    assert!(batcher.next_indices(0).is_empty());
    assert!(Batcher::new(0, 7, false).is_err());
}

/// The indices of `epochs` whole epochs drawn in batches of `b`.
fn draw(batcher: &mut Batcher, n: usize, b: usize, epochs: usize) -> Vec<Vec<usize>> {
    let mut all = Vec::new();
    while all.len() < n * epochs {
        all.extend(batcher.next_indices(b));
    }
    all.truncate(n * epochs);
    all.chunks(n).map(<[usize]>::to_vec).collect()
}

#[test]
fn batcher_shuffles_a_seeded_permutation_per_epoch() {
    let (n, b) = (37, 5);
    let epochs = draw(&mut Batcher::new(n, 42, true).unwrap(), n, b, 4);
    let identity: Vec<usize> = (0..n).collect();
    for (e, order) in epochs.iter().enumerate() {
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(sorted, identity, "epoch {e} is not a permutation");
        assert_ne!(*order, identity, "epoch {e} is not shuffled");
    }
    for e in 1..epochs.len() {
        assert_ne!(epochs[e], epochs[e - 1], "epochs {} and {e} repeat", e - 1);
    }
    assert_eq!(draw(&mut Batcher::new(n, 42, true).unwrap(), n, b, 4), epochs);
    // Another batch size draws the same order; another seed a different one.
    assert_eq!(draw(&mut Batcher::new(n, 42, true).unwrap(), n, 3, 4), epochs);
    assert_ne!(draw(&mut Batcher::new(n, 43, true).unwrap(), n, b, 4)[0], epochs[0]);
    // The order is fixed by the seed alone, the same on every machine (SplitMix64, Fisher-Yates; checked against
    // an independent Python implementation).
    assert_eq!(
        Batcher::new(10, 42, true).unwrap().next_indices(10),
        vec![5, 1, 9, 6, 7, 2, 4, 0, 8, 3]
    );
}

#[test]
fn batcher_state_restores_the_same_batches() {
    for shuffle in [false, true] {
        let (n, b) = (10, 3);
        let mut original = Batcher::new(n, 5, shuffle).unwrap();
        for _ in 0..7 {
            original.next_indices(b);
        }
        let saved = serde_json::to_string(&original.state()).unwrap();
        let state: BatcherState = serde_json::from_str(&saved).unwrap();
        assert_eq!(state, BatcherState { epoch: 2, cursor: 1 });
        let mut resumed = Batcher::restore(n, 5, shuffle, state).unwrap();
        for step in 0..20 {
            assert_eq!(
                resumed.next_indices(b),
                original.next_indices(b),
                "shuffle {shuffle}, step {step}"
            );
        }
        assert_eq!(resumed.state(), original.state());
    }
    let past = BatcherState { epoch: 0, cursor: 10 };
    assert!(matches!(Batcher::restore(10, 5, true, past), Err(Error::Invalid(_))));
}

#[test]
fn make_batch_pads_ids_and_masks_labels() {
    let data = TokenData {
        sequences: vec![vec![1, 2, 3], vec![4, 5], vec![6, 7, 8, 9]],
        packed: false,
        files: Vec::new(),
    };
    let batch = make_batch(&data, &[2, 0, 1], 99);
    let m = IGNORE_INDEX;
    assert_eq!(IGNORE_INDEX, -100);
    assert_eq!(
        batch,
        Batch {
            ids: vec![6, 7, 8, 9, 1, 2, 3, 99, 4, 5, 99, 99],
            labels: vec![6, 7, 8, 9, 1, 2, 3, m, 4, 5, m, m],
            batch: 3,
            len: 4,
        }
    );
    // Rows of one length need no padding.
    let batch = make_batch(&data, &[1, 1], 0);
    assert_eq!(
        (batch.ids, batch.labels, batch.len),
        (vec![4, 5, 4, 5], vec![4, 5, 4, 5], 2)
    );
}

// --- Hub datasets ---

const REPO: &str = "tiny-org/tiny-stories";
const MAIN_SHA: &str = "1111111111111111111111111111111111111111";
const V1_SHA: &str = "2222222222222222222222222222222222222222";
const V2_SHA: &str = "3333333333333333333333333333333333333333";

fn ids_row(ids: &[u32]) -> String {
    format!("{{\"input_ids\": {ids:?}}}\n")
}

/// Repository contents per commit: `main` has train shards and a test file under `data/`, `v1` train and valid
/// files at the root and a `train` folder (and a file whose name only contains "train"), `v2` no split names.
fn commits() -> Commits {
    let file = |ids: &[u32]| ids_row(ids).into_bytes();
    HashMap::from([
        (
            MAIN_SHA,
            vec![
                ("README.md", b"# a dataset".to_vec()),
                ("data/train-00001-of-00002.jsonl", file(&[3, 4])),
                ("data/test-00000-of-00001.jsonl", file(&[9, 9])),
                ("data/train-00000-of-00002.jsonl", file(&[1, 2])),
            ],
        ),
        (
            V1_SHA,
            vec![
                ("stories-valid.txt", b"not read".to_vec()),
                ("stories-train.jsonl", file(&[5, 6])),
                ("constraint.jsonl", file(&[9, 9])),
                ("train/0.jsonl", file(&[4, 4])),
                ("validation/0.jsonl", file(&[9, 9])),
            ],
        ),
        (
            V2_SHA,
            vec![("part-b.jsonl", file(&[8, 8])), ("part-a.jsonl", file(&[7, 7]))],
        ),
    ])
}

fn options(endpoint: &str, cache: &Path, offline: bool) -> HubOptions {
    HubOptions {
        endpoint: endpoint.to_string(),
        cache_dir: cache.to_path_buf(),
        token: None,
        offline,
        progress: false,
    }
}

fn hub_load(source: &str, opts: &HubOptions) -> hierarchos::nn::Result<TokenData> {
    TokenData::load_with(source, None, 8, opts)
}

#[test]
fn hub_dataset_train_split_then_offline() {
    let server = HubServer::start(Repo {
        id: REPO,
        dataset: true,
        revisions: &[("main", MAIN_SHA), ("v1", V1_SHA), ("v2", V2_SHA)],
        commits: commits(),
        token: None,
    });
    let cache = tmpdir("data-hub-cache");
    let opts = options(&server.endpoint, &cache, false);
    let snapshot = cache.join("datasets--tiny-org--tiny-stories/snapshots");

    let data = hub_load(REPO, &opts).unwrap();
    assert_eq!(data.sequences, vec![vec![1, 2], vec![3, 4]]);
    assert_eq!(
        data.files,
        vec![
            snapshot.join(MAIN_SHA).join("data/train-00000-of-00002.jsonl"),
            snapshot.join(MAIN_SHA).join("data/train-00001-of-00002.jsonl"),
        ]
    );
    let log = server.requests();
    assert_eq!(log[0], format!("GET /api/datasets/{REPO}/revision/main "), "{log:#?}");
    assert!(
        log[1..]
            .iter()
            .all(|l| l.starts_with(&format!("GET /datasets/{REPO}/resolve/{MAIN_SHA}/data/train-"))),
        "{log:#?}"
    );
    // A second load re-resolves the revision but downloads nothing.
    let fetched = log.len();
    assert_eq!(hub_load(REPO, &opts).unwrap(), data);
    assert_eq!(server.requests().len(), fetched + 1);

    // Root files named for the train split; files without split names are all read, in name order.
    let v1 = hub_load(&format!("{REPO}@v1"), &opts).unwrap();
    assert_eq!(v1.sequences, vec![vec![5, 6], vec![4, 4]]);
    assert_eq!(
        hub_load(&format!("{REPO}@v2"), &opts).unwrap().sequences,
        vec![vec![7, 7], vec![8, 8]]
    );
    let e = hub_load("tiny-org/absent", &opts).unwrap_err();
    assert!(
        matches!(e, Error::Hub(_)) && e.to_string().contains("tiny-org/absent"),
        "{e}"
    );
    drop(server);

    // Offline: from the cache alone, by branch, tag or commit.
    let offline = options("http://127.0.0.1:9", &cache, true);
    assert_eq!(hub_load(REPO, &offline).unwrap(), data);
    assert_eq!(hub_load(&format!("{REPO}@{MAIN_SHA}"), &offline).unwrap(), data);
    assert_eq!(hub_load(&format!("{REPO}@v1"), &offline).unwrap(), v1);
    for source in ["tiny-org/other", "tiny-org/tiny-stories@v3"] {
        let e = hub_load(source, &offline).unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(e, Error::Hub(_))
                && msg.contains("HF_HUB_OFFLINE")
                && msg.contains(source.split('@').next().unwrap()),
            "{msg}"
        );
    }
    // Not Hub ids: reported as missing paths; a bad revision as such.
    for source in ["name-only", "a/b/c", "./x/y", "org/-bad"] {
        let e = hub_load(source, &offline).unwrap_err();
        assert!(
            matches!(e, Error::Invalid(_)) && e.to_string().contains("no such file"),
            "{source}: {e}"
        );
    }
    let e = hub_load("org/x@../../etc", &offline).unwrap_err();
    assert!(e.to_string().contains("revision"), "{e}");
    std::fs::remove_dir_all(&cache).unwrap();
}

/// The web demo reads data held in memory: the same sequences as from disk, and the same errors.
#[test]
fn files_held_in_memory_read_as_on_disk() {
    let tok = tokenizer();
    let dir = tmpdir("data-memory");
    let text = format!("{}\n\n{}\n{}", DOCS[0], DOCS[1], DOCS[2]);
    let jsonl: Vec<String> = DOCS
        .iter()
        .map(|d| serde_json::json!({ "text": d }).to_string())
        .collect();
    for (name, bytes) in [("a.txt", text.into_bytes()), ("b.jsonl", jsonl.join("\n").into_bytes())] {
        let path = dir.join(name);
        std::fs::write(&path, &bytes).unwrap();
        let on_disk = load(&path, Some(&tok), 8).unwrap();
        let in_memory = TokenData::from_memory(&path, &bytes, Some(&tok), 8).unwrap();
        assert_eq!(in_memory, on_disk, "{name}");
    }
    let bad = TokenData::from_memory(Path::new("x.jsonl"), b"{\"text\": 3}\n", Some(&tok), 8).unwrap_err();
    assert_has(&bad.to_string(), &["x.jsonl", "line 1", "`text` is not a string"]);
    let bad = TokenData::from_memory(Path::new("y.txt"), b"ok\n\xff\n", Some(&tok), 2).unwrap_err();
    assert_has(&bad.to_string(), &["y.txt", "line 2", "UTF-8"]);
    let bad = TokenData::from_memory(Path::new("z.parquet"), b"", Some(&tok), 2).unwrap_err();
    assert_has(&bad.to_string(), &["z.parquet", ".txt, .jsonl"]);
    std::fs::remove_dir_all(&dir).unwrap();
}
