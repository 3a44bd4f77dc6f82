//! The language the Linux webview (WebKitGTK) reports as `navigator.language`. WebKitGTK derives it
//! from the process locale, and under `C`/`POSIX` (containers, CI, minimal systems) reports `c`,
//! which is not a language tag: every `Intl` constructor given it throws, and the UI's chart
//! library calls one as its module loads, leaving the window blank. The shell therefore tells the
//! webview its language explicitly. macOS's WKWebView always reports a valid tag.

/// A BCP 47 tag from the locale environment (`LC_ALL`, `LC_CTYPE`, `LANG`, the first one set, as
/// the C library reads them): `de_DE.UTF-8` -> `de-DE`, `pt_BR@euro` -> `pt-BR`; `C`, `POSIX`, an
/// unset or an unreadable locale -> `en-US`.
pub fn from_locale(lc_all: Option<&str>, lc_ctype: Option<&str>, lang: Option<&str>) -> String {
    let locale = [lc_all, lc_ctype, lang].into_iter().flatten().find(|v| !v.is_empty()).unwrap_or("");
    let name = locale.split(['.', '@']).next().unwrap_or("");
    let mut parts = name.split('_');
    let language = parts.next().unwrap_or("");
    let region = parts.next();
    let letters = |s: &str, n: std::ops::RangeInclusive<usize>| {
        n.contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphabetic())
    };
    if !letters(language, 2..=3) || parts.next().is_some() {
        return "en-US".into();
    }
    match region {
        Some(r) if letters(r, 2..=2) || (r.len() == 3 && r.bytes().all(|b| b.is_ascii_digit())) => {
            format!("{}-{}", language.to_ascii_lowercase(), r.to_ascii_uppercase())
        }
        Some(_) => "en-US".into(),
        None => language.to_ascii_lowercase(),
    }
}

/// [`from_locale`] of this process.
pub fn of_process() -> String {
    let var = |n: &str| std::env::var(n).ok();
    from_locale(var("LC_ALL").as_deref(), var("LC_CTYPE").as_deref(), var("LANG").as_deref())
}

/// Sets the language of the webview's context (before it loads the UI).
#[cfg(target_os = "linux")]
pub fn apply(window: &tauri::WebviewWindow) -> tauri::Result<()> {
    let language = of_process();
    window.with_webview(move |webview| {
        use webkit2gtk::{WebContextExt, WebViewExt};
        if let Some(context) = webview.inner().context() {
            context.set_preferred_languages(&[language.as_str()]);
        }
    })
}

#[cfg(not(target_os = "linux"))]
pub fn apply(_window: &tauri::WebviewWindow) -> tauri::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::from_locale;

    #[test]
    fn locales_become_language_tags_and_c_becomes_english() {
        let cases = [
            ((None, None, Some("de_DE.UTF-8")), "de-DE"),
            ((Some("fr_CA.utf8"), None, Some("de_DE.UTF-8")), "fr-CA"),
            ((None, Some("pt_BR@euro"), None), "pt-BR"),
            ((None, None, Some("es_419.UTF-8")), "es-419"),
            ((None, None, Some("nl")), "nl"),
            ((None, None, Some("C.UTF-8")), "en-US"),
            ((None, None, Some("C")), "en-US"),
            ((Some("POSIX"), None, None), "en-US"),
            ((Some(""), None, None), "en-US"),
            ((None, None, None), "en-US"),
            ((None, None, Some("xx_YY_ZZ")), "en-US"),
        ];
        for ((all, ctype, lang), want) in cases {
            assert_eq!(from_locale(all, ctype, lang), want, "{all:?} {ctype:?} {lang:?}");
        }
    }
}
