#!/usr/bin/env bash
# The brokers Sluiceway is compared with, from the OS packages, on loopback only.
#
#   benchmarks/peers.sh install            apt-get install rabbitmq-server activemq (if missing)
#   benchmarks/peers.sh rabbitmq DIR PORT  run RabbitMQ (STOMP plugin on 127.0.0.1:PORT) in the
#                                          foreground, its state under DIR, until SIGTERM
#   benchmarks/peers.sh activemq DIR PORT  run ActiveMQ Classic (STOMP transport on
#                                          127.0.0.1:PORT) in the foreground, state under DIR
#
# Neither package's own service is enabled or started: each run gets a fresh state directory, the
# package's default settings (heap, memory limits, disk sync), and listeners bound to 127.0.0.1.
set -euo pipefail

install_peers() {
    local missing=()
    [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || missing+=(rabbitmq-server)
    [ -f /usr/share/activemq/bin/activemq.jar ] || missing+=(activemq)
    [ ${#missing[@]} -eq 0 ] && return
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update
    # policy-rc.d keeps the packages' services from starting (containers answer 101 already).
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"
}

run_rabbitmq() {
    local dir="$1" port="$2"
    mkdir -p "$dir/home" "$dir/log" "$dir/mnesia"
    echo '[rabbitmq_stomp].' >"$dir/enabled_plugins"
    # AMQP and the inter-node port on loopback too: nothing of this broker listens outside.
    cat >"$dir/rabbitmq.conf" <<EOF
listeners.tcp.default = 127.0.0.1:$((port + 1))
stomp.listeners.tcp.1 = 127.0.0.1:$port
EOF
    export HOME="$dir/home" ERL_EPMD_ADDRESS=127.0.0.1
    export RABBITMQ_NODENAME="bench$port@localhost" RABBITMQ_BASE="$dir"
    export RABBITMQ_MNESIA_BASE="$dir/mnesia" RABBITMQ_LOG_BASE="$dir/log"
    export RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf" RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins"
    export RABBITMQ_DIST_PORT=$((port + 2))
    export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
    exec /usr/lib/rabbitmq/bin/rabbitmq-server
}

run_activemq() {
    local dir="$1" port="$2"
    mkdir -p "$dir/conf" "$dir/data" "$dir/tmp"
    cp /etc/activemq/instances-available/main/log4j2.properties "$dir/conf/"
    # The package's instance, with a STOMP transport in place of OpenWire.
    cat >"$dir/conf/activemq.xml" <<EOF
<beans xmlns="http://www.springframework.org/schema/beans"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
  xsi:schemaLocation="http://www.springframework.org/schema/beans http://www.springframework.org/schema/beans/spring-beans-2.0.xsd
  http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">
  <bean class="org.springframework.beans.factory.config.PropertyPlaceholderConfigurer"/>
  <broker xmlns="http://activemq.apache.org/schema/core" useJmx="false" brokerName="bench"
          dataDirectory="\${activemq.data}">
    <persistenceAdapter><kahaDB directory="\${activemq.data}/kahadb"/></persistenceAdapter>
    <transportConnectors>
      <transportConnector name="stomp" uri="stomp://127.0.0.1:$port"/>
    </transportConnectors>
  </broker>
</beans>
EOF
    # The package's JVM settings (heap size and so on).
    local ACTIVEMQ_OPTS="" INSTANCE=bench
    # shellcheck disable=SC1091
    . /usr/share/activemq/activemq-options
    # shellcheck disable=SC2086
    exec java $ACTIVEMQ_OPTS -Dactivemq.home=/usr/share/activemq -Dactivemq.base="$dir" \
        -Dactivemq.conf="$dir/conf" -Dactivemq.data="$dir/data" -Djava.io.tmpdir="$dir/tmp" \
        -jar /usr/share/activemq/bin/activemq.jar start "xbean:file:$dir/conf/activemq.xml"
}

case "${1:-}" in
    install) install_peers ;;
    rabbitmq) run_rabbitmq "$2" "$3" ;;
    activemq) run_activemq "$2" "$3" ;;
    *)
        echo "usage: $0 install | rabbitmq DIR PORT | activemq DIR PORT" >&2
        exit 2
        ;;
esac
