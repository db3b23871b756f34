# make install / make uninstall into a temporary DESTDIR: the binary, manual pages, completions and themes land where the issue says, and all of them go again.
IN=$tmp/install
ROOT=$(cd "$here/../.." && pwd)
# the PREFIX the objects were built for (build/.prefix), so installing rebuilds nothing
IPREFIX=$(cat "$ROOT/build/.prefix" 2>/dev/null || echo /usr/local)
imake() { env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory -C "$ROOT" PREFIX="$IPREFIX" DESTDIR="$IN" "$@"; }

if imake install >"$IN.log" 2>&1; then ok "make install DESTDIR=... PREFIX=$IPREFIX"
else bad "make install DESTDIR=... PREFIX=$IPREFIX" "$(tail -5 "$IN.log")"; fi
P=$IN$IPREFIX
want="bin/kvchat share/man/man1/kvchat.1 share/man/man5/kvchat.conf.5 share/man/man5/kvchat-theme.5
      share/bash-completion/completions/kvchat share/zsh/site-functions/_kvchat
      share/fish/vendor_completions.d/kvchat.fish"
for t in "$ROOT"/themes/*.theme; do want="$want share/kvchat/themes/$(basename "$t")"; done
missing=
for f in $want; do [ -f "$P/$f" ] || missing="$missing $f"; done
if [ -z "$missing" ]; then ok "installed: binary, 3 manual pages, bash/zsh/fish completions, $(ls "$ROOT"/themes/*.theme | wc -l) themes"
else bad "installed files" "missing:$missing"; fi
[ -x "$P/bin/kvchat" ] && "$P/bin/kvchat" --version | grep -q "data dir $IPREFIX/share/kvchat" &&
    ok "the installed binary looks for themes in $IPREFIX/share/kvchat" || bad "the installed binary's data dir"
cmp -s "$P/share/bash-completion/completions/kvchat" "$ROOT/completions/kvchat.bash" && ok "bash completion installed as completions/kvchat" ||
    bad "bash completion installed as completions/kvchat"
if command -v mandoc >/dev/null 2>&1 && mandoc -T markdown "$P/share/man/man1/kvchat.1" 2>/dev/null | grep -q "^# EXIT STATUS"; then
    ok "the installed kvchat(1) renders"
else bad "the installed kvchat(1) renders"; fi
# anything the install put there that is not ours?
extra=$(cd "$IN" && find . -type f | sed "s|^\./${IPREFIX#/}/||" | grep -vxF -f <(printf '%s\n' $want))
[ -z "$extra" ] && ok "install puts nothing else in DESTDIR" || bad "install puts nothing else in DESTDIR" "$extra"

if imake uninstall >"$IN.log" 2>&1; then ok "make uninstall"; else bad "make uninstall" "$(tail -5 "$IN.log")"; fi
left=$(find "$IN" -type f 2>/dev/null)
[ -z "$left" ] && ok "uninstall removes every installed file" || bad "uninstall removes every installed file" "$left"
[ ! -d "$P/share/kvchat" ] && ok "uninstall removes share/kvchat" || bad "uninstall removes share/kvchat"
