//! Python keywords as the library's [`LoadOptions`]: each keyword is the Python keyword of a key
//! of the library's table, `LoadOptions::specs()` (the key itself, or `store_options`, a mapping
//! of `store_option`s), or one of its aliases (`device_memory`), and each value is
//! spelled as text and handed to the library's one parser, [`LoadOptions::set`], as the `stage`
//! command's flags and C's `stg_config_set` are. Only what cannot be text stays here: `select`
//! and `rows` given as functions, which are called once per tensor of the checkpoint and become
//! exact names.

use std::collections::HashMap;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use safetensors_staging::{Checkpoint, LoadOptions, OptionSpec, escape_name};

use crate::errors;
use crate::tensor_info::TensorInfo;

/// The keywords, as given; functions of `select`/`rows` kept for [`Keywords::apply_functions`].
pub(crate) struct Keywords<'py> {
    pub(crate) options: LoadOptions,
    select_fn: Option<Bound<'py, PyAny>>,
    rows_fn: Option<Bound<'py, PyAny>>,
    /// `select` chose nothing (an empty list, or a function that accepted no name): the load
    /// loads nothing.
    pub(crate) select_none: bool,
}

/// The text a Python value spells: `str` as is, `bool` as `true`/`false`, an `int` in decimal, a
/// path-like through `os.fspath`, a `torch.device` (or anything else) through `str()`.
pub(crate) fn spelling(value: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(text) = value.cast::<PyString>() {
        return Ok(text.to_cow()?.into_owned());
    }
    if let Ok(flag) = value.extract::<bool>()
        && value.is_instance_of::<pyo3::types::PyBool>()
    {
        return Ok(if flag { "true" } else { "false" }.to_owned());
    }
    let os = value.py().import("os")?;
    if value.hasattr("__fspath__")? {
        return os.call_method1("fspath", (value,))?.str()?.extract();
    }
    value.str()?.extract()
}

/// A row range spelled as text: `(start, end)` as `start:end`, text as it is.
pub(crate) fn rows_spelling(spec: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(text) = spec.cast::<PyString>() {
        return Ok(text.to_cow()?.into_owned());
    }
    match spec.extract::<(usize, usize)>() {
        Ok((start, end)) => Ok(format!("{start}:{end}")),
        Err(_) => Err(errors::to_py(safetensors_staging::Error::InvalidOption {
            key: "rows".into(),
            value: spec.repr()?.extract()?,
            reason: "expected (start, end), \"START:END\" or \"RANK/PARTS\"".into(),
        })),
    }
}

impl<'py> Keywords<'py> {
    /// The options the keywords give; an unknown keyword is a `TypeError`, as Python's own, and
    /// a value the library does not parse an `InvalidOptionError` (a `ValueError`). `None`
    /// keeps a default.
    pub(crate) fn parse(kwargs: Option<&Bound<'py, PyDict>>) -> PyResult<Self> {
        let mut keywords = Self {
            options: LoadOptions::new(),
            select_fn: None,
            rows_fn: None,
            select_none: false,
        };
        let Some(kwargs) = kwargs else {
            return Ok(keywords);
        };
        for (key, value) in kwargs.iter() {
            let key: String = key.extract()?;
            if value.is_none() {
                continue;
            }
            keywords.set(&key, &value)?;
        }
        Ok(keywords)
    }

    fn set_text(&mut self, key: &str, value: &str) -> PyResult<()> {
        self.options.set(key, value).map_err(errors::to_py)
    }

    fn set(&mut self, keyword: &str, value: &Bound<'py, PyAny>) -> PyResult<()> {
        let Some(spec) = spec_of_keyword(keyword) else {
            return Err(PyTypeError::new_err(format!(
                "unexpected keyword argument '{keyword}'"
            )));
        };
        let key = spec.name();
        match key {
            "select" if value.is_callable() => self.select_fn = Some(value.clone()),
            "select" if value.is_instance_of::<PyString>() => {
                self.set_text("select", &spelling(value)?)?;
            }
            "select" => {
                let mut any = false;
                for pattern in value.try_iter().map_err(|_| {
                    PyTypeError::new_err(
                        "select: expected a name or glob, an iterable of them, or a function of a name",
                    )
                })? {
                    self.set_text("select", &spelling(&pattern?)?)?;
                    any = true;
                }
                self.select_none = !any;
            }
            "rows" if value.is_callable() => self.rows_fn = Some(value.clone()),
            "rows" => {
                let rows = value.cast::<PyDict>().map_err(|_| {
                    PyTypeError::new_err(
                        "rows: expected a dict of name (or glob) to range, or a function",
                    )
                })?;
                for (pattern, spec) in rows.iter() {
                    let rule = format!("{}={}", spelling(&pattern)?, rows_spelling(&spec)?);
                    self.set_text("rows", &rule)?;
                }
            }
            "store_option" => {
                let mapping = value.cast::<PyDict>().map_err(|_| {
                    PyTypeError::new_err("store_options: expected a dict of str to str")
                })?;
                for (k, v) in mapping.iter() {
                    let pair = format!("{}={}", spelling(&k)?, spelling(&v)?);
                    self.set_text("store_option", &pair)?;
                }
            }
            "allow_redirect" if !value.is_instance_of::<PyString>() => {
                for host in value.try_iter().map_err(|_| {
                    PyTypeError::new_err("allow_redirect: expected a host or an iterable of hosts")
                })? {
                    self.set_text("allow_redirect", &spelling(&host?)?)?;
                }
            }
            // The keyword as given (the key or an alias): the library's errors name it.
            _ => self.set_text(keyword, &spelling(value)?)?,
        }
        Ok(())
    }

    /// The `select` function, when one was given.
    pub(crate) fn select_function(&self) -> Option<Py<PyAny>> {
        self.select_fn.as_ref().map(|f| f.clone().unbind())
    }

    /// Calls `select` and `rows` given as functions on every tensor of `checkpoint` (before
    /// anything is read) and adds what they chose as exact names. `select`'s answers already
    /// given (`asked`: an index's names, asked before its headers were read) are not asked
    /// again.
    pub(crate) fn apply_functions(
        &mut self,
        checkpoint: &Checkpoint,
        asked: &HashMap<String, bool>,
    ) -> PyResult<()> {
        if let Some(select) = self.select_fn.take() {
            let mut any = false;
            for tensor in checkpoint.tensors() {
                let chosen = match asked.get(&tensor.name) {
                    Some(&chosen) => chosen,
                    None => select.call1((tensor.name.as_str(),))?.is_truthy()?,
                };
                if chosen {
                    self.set_text("select", &escape_name(&tensor.name))?;
                    any = true;
                }
            }
            // Nothing chosen loads nothing, as an empty list does.
            self.select_none = !any;
        }
        if let Some(rows) = self.rows_fn.take() {
            for tensor in checkpoint.tensors() {
                let spec = rows.call1((tensor.name.as_str(), TensorInfo::new(tensor)))?;
                if !spec.is_none() {
                    let rule = format!("{}={}", escape_name(&tensor.name), rows_spelling(&spec)?);
                    self.set_text("rows", &rule)?;
                }
            }
        }
        Ok(())
    }

    /// Whether `select` or `rows` is a function (it needs the checkpoint's headers).
    pub(crate) fn has_functions(&self) -> bool {
        self.select_fn.is_some() || self.rows_fn.is_some()
    }
}

/// The option a Python keyword spells: its Python keyword (`store_options` for `store_option`)
/// or one of its aliases.
fn spec_of_keyword(keyword: &str) -> Option<&'static OptionSpec> {
    LoadOptions::specs()
        .iter()
        .find(|spec| spec.python_keyword() == keyword || spec.aliases().contains(&keyword))
}

/// `_option_table()`: the library's table of load options, one dict per key (`name`,
/// `keyword`, `aliases`, `kind`, `value_name`, `choices`, `default`, `default_is_value`,
/// `help`), in the table's order: what the stubs' `LoadOptions` and the reference page are
/// checked against.
#[pyfunction]
#[pyo3(name = "_option_table")]
pub(crate) fn option_table(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    let rows = PyList::empty(py);
    for spec in LoadOptions::specs() {
        let row = PyDict::new(py);
        row.set_item("name", spec.name())?;
        row.set_item("keyword", spec.python_keyword())?;
        row.set_item("aliases", spec.aliases().to_vec())?;
        row.set_item("kind", spec.kind().as_str())?;
        row.set_item("value_name", spec.value_name())?;
        row.set_item("choices", spec.choices().to_vec())?;
        row.set_item("default", spec.default())?;
        row.set_item("default_is_value", spec.default_is_value())?;
        row.set_item("help", spec.help())?;
        rows.append(row)?;
    }
    Ok(rows)
}

/// `_options(**keywords)`: the library's options the keywords give, as the library prints them
/// (`stage --print-options` and C's `stg_config_describe` print the same for the same settings).
#[pyfunction]
#[pyo3(name = "_options", signature = (**kwargs))]
pub(crate) fn options(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<String> {
    let keywords = Keywords::parse(kwargs)?;
    if keywords.has_functions() {
        return Err(PyTypeError::new_err(
            "select and rows as functions need a checkpoint: they are applied by stage()",
        ));
    }
    Ok(keywords.options.describe())
}
