"""`sluiceway analyze`: a Spark job over the broker's metrics history, and its report.

    command   the command line: options, exit statuses, one-line errors
    options   what a run is asked to do (times, pool sizes), checked before Spark starts
    sources   where the history is, and its schema for Spark
    session   starting Spark (local mode or --master), with Java looked for first
    job       the Spark job: frames (samples and runs), traffic, consumers, producers
    results   the small typed values the job collects to the driver
    rules     recommended consumerFlowLimit / consumerFlowThreshold, with the reason for each
    adaptive  when consumerFlowLimit=auto serves better than a number; the windows auto chose
    deadlines deadline misses, and when a FIFO queue should deliver earliest deadline first
    findings  what a rule reports, and the measures the rule modules share
    summary, report, plots   summary.json, report.html and its matplotlib figures

Only `command` is imported by the command line; it imports the rest, and PySpark, when it runs.
"""
