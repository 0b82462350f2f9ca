# Sourced by the set-up scripts: apt_install PACKAGE... installs the Debian
# packages given (none: nothing to do), with sudo when not root.
apt_install() {
    [ $# -gt 0 ] || return 0
    echo "setup: installing system packages: $*"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}
