//! A directed graph of named nodes, each edge with the evidence that made
//! it, and what the check asks of it: the strongly connected components
//! (Tarjan), the circles among them with a shortest example, and the
//! components in layers (each uses only lower layers).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// A directed graph of named nodes; each edge keeps the first place that
/// made it.
#[derive(Debug, Default)]
pub struct Graph {
    nodes: BTreeSet<String>,
    edges: BTreeMap<String, BTreeMap<String, String>>,
}

impl Graph {
    pub(super) fn add_node(&mut self, node: String) {
        self.nodes.insert(node);
    }

    /// An edge `from -> to` (none from a node to itself), with its evidence
    /// unless it already has some.
    pub(super) fn add_edge(&mut self, from: &str, to: &str, evidence: &str) {
        if from == to {
            return;
        }
        self.nodes.insert(from.to_string());
        self.nodes.insert(to.to_string());
        self.edges
            .entry(from.to_string())
            .or_default()
            .entry(to.to_string())
            .or_insert_with(|| evidence.to_string());
    }

    pub fn nodes(&self) -> &BTreeSet<String> {
        &self.nodes
    }

    /// The edges as (from, to, evidence), in order.
    pub fn edges(&self) -> impl Iterator<Item = (&str, &str, &str)> {
        self.edges.iter().flat_map(|(from, to)| {
            to.iter()
                .map(move |(to, evidence)| (from.as_str(), to.as_str(), evidence.as_str()))
        })
    }

    /// The nodes `node` has an edge to.
    pub fn targets(&self, node: &str) -> impl Iterator<Item = &String> {
        self.edges.get(node).into_iter().flat_map(|m| m.keys())
    }

    /// Strongly connected components (Tarjan), each sorted, each after
    /// every component it reaches.
    fn components(&self) -> Vec<Vec<String>> {
        struct State<'g> {
            graph: &'g Graph,
            index: BTreeMap<&'g str, usize>,
            low: BTreeMap<&'g str, usize>,
            stack: Vec<&'g str>,
            on_stack: BTreeSet<&'g str>,
            out: Vec<Vec<String>>,
        }
        fn visit<'g>(s: &mut State<'g>, v: &'g str) {
            let n = s.index.len();
            s.index.insert(v, n);
            s.low.insert(v, n);
            s.stack.push(v);
            s.on_stack.insert(v);
            for w in s.graph.targets(v) {
                let w = w.as_str();
                let reached = if !s.index.contains_key(w) {
                    visit(s, w);
                    s.low[w]
                } else if s.on_stack.contains(w) {
                    s.index[w]
                } else {
                    continue;
                };
                let low = s.low.get_mut(v).expect("visited");
                *low = (*low).min(reached);
            }
            if s.low[v] == s.index[v] {
                let mut component = Vec::new();
                while let Some(w) = s.stack.pop() {
                    s.on_stack.remove(w);
                    component.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                component.sort();
                s.out.push(component);
            }
        }
        let mut s = State {
            graph: self,
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            on_stack: BTreeSet::new(),
            out: Vec::new(),
        };
        for v in &self.nodes {
            if !s.index.contains_key(v.as_str()) {
                visit(&mut s, v);
            }
        }
        s.out
    }

    /// The components with more than one node: the import circles.
    pub fn cycles(&self) -> Vec<Vec<String>> {
        let mut cycles: Vec<Vec<String>> = self
            .components()
            .into_iter()
            .filter(|c| c.len() > 1)
            .collect();
        cycles.sort();
        cycles
    }

    /// Components in layers: layer 0 uses nothing else, layer n uses only
    /// lower layers (at least one of n-1).
    pub fn layers(&self) -> Vec<Vec<Vec<String>>> {
        let components = self.components();
        let of: BTreeMap<&str, usize> = components
            .iter()
            .enumerate()
            .flat_map(|(k, c)| c.iter().map(move |n| (n.as_str(), k)))
            .collect();
        // Tarjan emits a component after everything it reaches: one pass.
        let mut layer = vec![0usize; components.len()];
        for (k, component) in components.iter().enumerate() {
            for node in component {
                for target in self.targets(node) {
                    let t = of[target.as_str()];
                    if t != k {
                        layer[k] = layer[k].max(layer[t] + 1);
                    }
                }
            }
        }
        let mut layers: Vec<Vec<Vec<String>>> =
            vec![Vec::new(); layer.iter().max().map_or(0, |m| m + 1)];
        for (k, component) in components.into_iter().enumerate() {
            layers[layer[k]].push(component);
        }
        for l in &mut layers {
            l.sort();
        }
        layers
    }

    /// A shortest circle through the first node of `component`, as
    /// `a, b, …, a`.
    pub fn example_cycle(&self, component: &[String]) -> Vec<String> {
        let inside: BTreeSet<&str> = component.iter().map(String::as_str).collect();
        let start = component[0].as_str();
        let mut previous: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = VecDeque::from([start]);
        while let Some(v) = queue.pop_front() {
            for w in self.targets(v).map(String::as_str) {
                if w == start {
                    // Back from v to the start, then turned around.
                    let mut cycle = vec![start.to_string()];
                    let mut at = v;
                    while at != start {
                        cycle.push(at.to_string());
                        at = previous[at];
                    }
                    cycle.push(start.to_string());
                    cycle.reverse();
                    return cycle;
                }
                if inside.contains(w) && !previous.contains_key(w) {
                    previous.insert(w, v);
                    queue.push_back(w);
                }
            }
        }
        component.to_vec()
    }
}
