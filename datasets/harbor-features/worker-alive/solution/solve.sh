#!/bin/bash
# a worker left running, in a session of its own: the tests talk to it after the agent's turn
cat > /app/pong.pl <<'PERL'
use IO::Socket::INET;
my $server = IO::Socket::INET->new(LocalAddr => "127.0.0.1:8765", Listen => 5, ReuseAddr => 1)
    or die "listen: $!";
while (my $client = $server->accept) {
    while (my $line = <$client>) { print $client "pong\n"; }
    close $client;
}
PERL
setsid nohup perl /app/pong.pl >/dev/null 2>&1 < /dev/null &
for _ in $(seq 50); do
    (exec 3<>/dev/tcp/127.0.0.1/8765) 2>/dev/null && exit 0
    sleep 0.1
done
echo "the server did not start" >&2
exit 1
