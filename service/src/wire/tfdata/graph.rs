//! The source of a DYNAMIC tf.data job, read from its dataset definition
//! without TensorFlow: the graph is decoded only as far as its dataset
//! nodes and their constant inputs. Served sources (each with the split
//! values TensorFlow's own split providers hand out): `range` (the element
//! values), `from_tensor_slices` (indices 0..n of the first dimension) and
//! `from_tensors` (index 0). Anything else is refused with a message naming
//! the source op.

use std::collections::HashMap;

use journal::pb::dispatcher::SplitSource;
use prost::Message;
use proto::tfgraph::{attr_value, DatasetDef, NodeDef, TensorProto};

const DT_INT32: i32 = 3;
const DT_INT64: i32 = 9;

/// The node name an input string refers to (`name:1` and `^name` included).
fn input_node(input: &str) -> &str {
    let name = input.strip_prefix('^').unwrap_or(input);
    name.split(':').next().unwrap_or(name)
}

fn is_dataset(op: &str) -> bool {
    op.contains("Dataset")
}

/// The tensor of a `Const` node.
fn const_tensor(node: &NodeDef) -> Option<&TensorProto> {
    if node.op != "Const" {
        return None;
    }
    match node.attr.get("value")?.value.as_ref()? {
        attr_value::Value::Tensor(t) => Some(t),
        _ => None,
    }
}

/// The scalar value of an int64 or int32 tensor.
fn scalar_i64(t: &TensorProto) -> Option<i64> {
    match t.dtype {
        DT_INT64 => t.int64_val.first().copied().or_else(|| {
            let b: [u8; 8] = t.tensor_content.get(..8)?.try_into().ok()?;
            Some(i64::from_le_bytes(b))
        }),
        DT_INT32 => t.int_val.first().map(|&v| i64::from(v)).or_else(|| {
            let b: [u8; 4] = t.tensor_content.get(..4)?.try_into().ok()?;
            Some(i64::from(i32::from_le_bytes(b)))
        }),
        _ => None,
    }
}

/// Where the splits of the dataset `definition` (a serialized `DatasetDef`)
/// come from, or why coordstore cannot split it.
pub fn split_source(definition: &[u8]) -> Result<SplitSource, String> {
    let def = DatasetDef::decode(definition).map_err(|e| {
        format!(
            "DYNAMIC sharding reads the dataset's graph, and its definition does not decode: {e}"
        )
    })?;
    let graph = def.graph.unwrap_or_default();
    let nodes: HashMap<&str, &NodeDef> = graph.node.iter().map(|n| (n.name.as_str(), n)).collect();
    // Source datasets: dataset nodes none of whose inputs is a dataset.
    let sources: Vec<&NodeDef> = graph
        .node
        .iter()
        .filter(|n| is_dataset(&n.op))
        .filter(|n| {
            !n.input
                .iter()
                .any(|i| nodes.get(input_node(i)).is_some_and(|m| is_dataset(&m.op)))
        })
        .collect();
    let unsupported = |why: &str| {
        let ops: Vec<&str> = sources.iter().map(|n| n.op.as_str()).collect();
        Err(format!(
            "DYNAMIC sharding (distributed_epoch) is served for a pipeline with one source: range, from_tensor_slices or from_tensors with constant inputs; this one has {}: {why}",
            if ops.is_empty() {
                "no source dataset".to_string()
            } else {
                format!("source op(s) {}", ops.join(", "))
            }
        ))
    };
    let [source] = sources[..] else {
        return unsupported("one source is needed");
    };
    let input_const = |k: usize| -> Option<&TensorProto> {
        const_tensor(nodes.get(input_node(source.input.get(k)?))?)
    };
    match source.op.as_str() {
        "RangeDataset" => {
            let arg = |k| input_const(k).and_then(scalar_i64);
            let (Some(start), Some(stop), Some(step)) = (arg(0), arg(1), arg(2)) else {
                return unsupported("its start, stop and step must be constants");
            };
            if step == 0 {
                return unsupported("its step is 0");
            }
            Ok(range_source(start, stop, step))
        }
        "TensorSliceDataset" => {
            let Some(first) = input_const(0) else {
                return unsupported("its components must be constants");
            };
            let Some(n) = first
                .tensor_shape
                .as_ref()
                .and_then(|s| s.dim.first())
                .map(|d| d.size)
            else {
                return unsupported("its components have no first dimension");
            };
            Ok(SplitSource {
                start: 0,
                step: 1,
                count: n.max(0),
            })
        }
        "TensorDataset" => Ok(SplitSource {
            start: 0,
            step: 1,
            count: 1,
        }),
        _ => unsupported("that op cannot be split here"),
    }
}

/// The splits of `range(start, stop, step)` (`step` not 0): its elements.
fn range_source(start: i64, stop: i64, step: i64) -> SplitSource {
    let span = i128::from(stop) - i128::from(start);
    let count = if (span > 0) == (step > 0) && span != 0 {
        let step = i128::from(step);
        ((span.abs() + step.abs() - 1) / step.abs()).min(i128::from(i64::MAX)) as i64
    } else {
        0
    };
    SplitSource { start, step, count }
}

/// A split as TensorFlow's split providers give it: an int64 scalar tensor.
pub fn split_tensor(value: i64) -> Vec<u8> {
    TensorProto {
        dtype: DT_INT64,
        tensor_shape: Some(Default::default()),
        tensor_content: Vec::new(),
        int_val: Vec::new(),
        int64_val: vec![value],
    }
    .encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::tfgraph::{tensor_shape_proto::Dim, AttrValue, GraphDef, TensorShapeProto};

    fn konst(name: &str, t: TensorProto) -> NodeDef {
        NodeDef {
            name: name.into(),
            op: "Const".into(),
            input: vec![],
            attr: [(
                "value".to_string(),
                AttrValue {
                    value: Some(attr_value::Value::Tensor(t)),
                },
            )]
            .into(),
        }
    }

    fn i64s(v: i64) -> TensorProto {
        TensorProto {
            dtype: DT_INT64,
            int64_val: vec![v],
            ..Default::default()
        }
    }

    fn node(name: &str, op: &str, inputs: &[&str]) -> NodeDef {
        NodeDef {
            name: name.into(),
            op: op.into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            attr: Default::default(),
        }
    }

    fn def(nodes: Vec<NodeDef>) -> Vec<u8> {
        DatasetDef {
            graph: Some(GraphDef { node: nodes }),
        }
        .encode_to_vec()
    }

    #[test]
    fn a_range_of_constants_splits_into_its_values() {
        let g = def(vec![
            konst("start", i64s(3)),
            konst("stop", i64s(10)),
            konst("step", i64s(2)),
            node("range", "RangeDataset", &["start", "stop:0", "step"]),
            node("map", "MapDataset", &["range", "^start"]),
        ]);
        assert_eq!(
            split_source(&g),
            Ok(SplitSource {
                start: 3,
                step: 2,
                count: 4
            })
        );
        let down = def(vec![
            konst("a", i64s(5)),
            konst("b", i64s(0)),
            konst("c", i64s(-2)),
            node("r", "RangeDataset", &["a", "b", "c"]),
        ]);
        assert_eq!(split_source(&down).map(|s| s.count), Ok(3));
    }

    #[test]
    fn slices_split_into_indices_and_other_sources_are_named() {
        let t = TensorProto {
            dtype: DT_INT64,
            tensor_shape: Some(TensorShapeProto {
                dim: vec![Dim {
                    size: 7,
                    name: String::new(),
                }],
                unknown_rank: false,
            }),
            ..Default::default()
        };
        let g = def(vec![konst("c", t), node("s", "TensorSliceDataset", &["c"])]);
        assert_eq!(split_source(&g).map(|s| s.count), Ok(7));
        let files = def(vec![
            konst("f", i64s(0)),
            node("t", "TFRecordDatasetV2", &["f"]),
        ]);
        let e = split_source(&files).unwrap_err();
        assert!(e.contains("TFRecordDatasetV2"), "{e}");
        let zip = def(vec![
            konst("a", i64s(0)),
            node("r1", "RangeDataset", &["a", "a", "a"]),
            node("r2", "RangeDataset", &["a", "a", "a"]),
            node("z", "ZipDataset", &["r1", "r2"]),
        ]);
        assert!(split_source(&zip).unwrap_err().contains("one source"));
        assert!(split_source(b"\xff\xff").is_err());
    }
}
