//! The layout of `tally config`: toml's pretty printer writes the arrays inside an array
//! (`antifraud.amount_tiers`) one number a line with no indentation; here each inner array
//! goes on one indented line.

use toml_edit::{DocumentMut, Item, Table, Value};

/// `text` (TOML) with every array of arrays laid out one inner array a line; `text`
/// unchanged if it does not parse.
pub(super) fn tidy(text: &str) -> String {
    let Ok(mut doc) = text.parse::<DocumentMut>() else { return text.to_owned() };
    tidy_table(doc.as_table_mut());
    doc.to_string()
}

fn tidy_table(table: &mut Table) {
    for (_, item) in table.iter_mut() {
        match item {
            Item::Table(t) => tidy_table(t),
            Item::Value(Value::Array(outer)) if outer.iter().any(Value::is_array) => {
                for value in outer.iter_mut() {
                    if let Value::Array(inner) = value {
                        inner.fmt();
                        inner.decor_mut().set_prefix("\n    ");
                    }
                }
                outer.set_trailing("\n");
                outer.set_trailing_comma(true);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::tidy;

    #[test]
    fn inner_arrays_go_one_a_line_indented() {
        let text =
            "[a]\nx = [\n    1,\n    2,\n]\ntiers = [\n    [\n    10,\n    1,\n],\n    [\n    20,\n    2,\n],\n]\n";
        assert_eq!(tidy(text), "[a]\nx = [\n    1,\n    2,\n]\ntiers = [\n    [10, 1],\n    [20, 2],\n]\n");
    }
}
